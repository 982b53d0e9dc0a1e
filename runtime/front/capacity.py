"""What the front admits per model, read from the served configs: each model's bound on open
streams (:class:`StreamCapacity`, for :class:`~runtime.front.guard.Admission`; every stream kind
asks it before admission) and the bounded queues its inferences go to (:class:`QueueCapacity`,
for :class:`~runtime.front.queues.QueueAdmission`; an ensemble is refused past its steps').
Both read through :class:`ConfigReader`: once per model and upstream socket, and a model whose
config cannot be read (unknown, not loaded yet) is asked for again only after
``unreadable_retry_s``, so a flood of requests naming unknown models costs tritonserver one
config read per name and interval, not one per request."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp

from tritonforge.runtime.front.guard import Admission, stream_capacities
from tritonforge.runtime.front.queues import QueueAdmission, ensemble_steps, queue_bounds

MAX_CONFIGS_PER_MODEL = 32  # configs read for one model (itself and its ensemble's steps)
UNREADABLE_RETRY_S = 1.0  # a model just loaded is admitted with its bounds within this
MAX_UNREADABLE = 4096  # unreadable names remembered at once (a flood of random names)


async def read_config(
    session: aiohttp.ClientSession, model: str, headers: Mapping[str, str], timeout_s: float
) -> dict[str, Any] | None:
    """``model``'s served config (Triton's JSON), or None when tritonserver cannot say (unknown
    or not loaded, not reachable, silent for ``timeout_s``)."""
    try:
        async with session.get(
            f"http://triton/v2/models/{urllib.parse.quote(model)}/config",
            headers=dict(headers),
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            if resp.status != 200:
                return None
            config = await resp.json(content_type=None)
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
        return None
    return config if isinstance(config, dict) else None


class ConfigReader:
    """Served configs by model name over the upstream's HTTP socket (:func:`read_config`), for
    the readers below: :meth:`fresh` tells when the upstream socket changed (a restart: what was
    read is stale), and :meth:`config` does not ask again for ``unreadable_retry_s`` after a
    model's config could not be read."""

    def __init__(
        self,
        upstream_socket: Callable[[], Path],
        session: Callable[[], aiohttp.ClientSession],
        admin_headers: Mapping[str, str],
        timeout_s: float,
        unreadable_retry_s: float = UNREADABLE_RETRY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.upstream_socket = upstream_socket
        self.session = session
        self.admin_headers = dict(admin_headers)
        self.timeout_s = timeout_s
        self.unreadable_retry_s = unreadable_retry_s
        self.clock = clock
        self._socket: Path | None = None
        self._unreadable: dict[str, float] = {}  # model -> when it may be asked for again

    def fresh(self) -> tuple[Path, bool]:
        """``(upstream socket, whether it changed since the last call)``; a change forgets the
        unreadable models too."""
        key = self.upstream_socket()
        if self._socket == key:
            return key, False
        self._socket, self._unreadable = key, {}
        return key, True

    def current(self, key: Path) -> bool:
        """Whether ``key`` is still the upstream socket (a read of a replaced one is dropped)."""
        return self._socket == key

    async def config(self, model: str) -> dict[str, Any] | None:
        """``model``'s served config, or None when it cannot be read now or could not be read
        less than ``unreadable_retry_s`` ago."""
        now = self.clock()
        if self._unreadable.get(model, now) > now:
            return None
        config = await read_config(self.session(), model, self.admin_headers, self.timeout_s)
        if config is None:
            if len(self._unreadable) >= MAX_UNREADABLE:
                self._unreadable = {m: t for m, t in self._unreadable.items() if t > now}
            if len(self._unreadable) < MAX_UNREADABLE:
                self._unreadable[model] = now + self.unreadable_retry_s
        else:
            self._unreadable.pop(model, None)
        return config


class StreamCapacity:
    """``await capacity(model)`` reads ``model``'s stream bound (:func:`stream_capacities`) into
    ``admission.capacities``: once per model and upstream socket (a restart reads it again), one
    config read the first time a stream goes to a model, none after. A model that is unknown or
    not loaded keeps ``max_open_streams`` until it is."""

    def __init__(self, admission: Admission, reader: ConfigReader) -> None:
        self.admission = admission
        self.reader = reader
        self._known: set[str] = set()

    async def __call__(self, model: str) -> None:
        if self.reader.fresh()[1]:
            self._known = set()
            self.admission.capacities = {}
        if model in self._known:
            return
        config = await self.reader.config(model)
        if config is None:
            return
        capacity = stream_capacities([config]).get(model)
        if capacity is not None:
            self.admission.capacities[model] = capacity
        self._known.add(model)


class QueueCapacity:
    """``async with capacity.slot(model):`` around an inference of ``model``: a slot of every
    bounded queue it goes to (:func:`queue_bounds`); for an ensemble :class:`QueueFullError`
    (503) naming the model and the bound when one is full (:meth:`QueueAdmission.enter`). The
    bounds are read from the served configs (the model's and, for an ensemble, its steps') once
    per model and upstream socket (a restart reads them again); concurrent first requests share
    one read. A model whose configs cannot be read yet is let through unbounded and read again
    later (:class:`ConfigReader`). ``enabled`` False (``FrontLimits.model_queue_admission``): no
    slot, no read."""

    def __init__(self, queues: QueueAdmission, reader: ConfigReader, enabled: bool = True) -> None:
        self.queues = queues
        self.reader = reader
        self.enabled = enabled
        self._reading: dict[str, asyncio.Future[None]] = {}

    @contextlib.asynccontextmanager
    async def slot(self, model: str) -> AsyncIterator[None]:
        if not self.enabled:
            yield
            return
        await self.read(model)
        held = self.queues.enter(model)
        try:
            yield
        finally:
            self.queues.leave(held)

    async def read(self, model: str) -> None:
        """Make sure ``model``'s bounds are known (read them unless they are)."""
        key, changed = self.reader.fresh()
        if changed:
            self._reading = {}
            self.queues.bounds = {}
        if model in self.queues.bounds:
            return
        reading = self._reading.get(model)
        if reading is None:
            reading = self._reading[model] = asyncio.ensure_future(self._read(model, key))
            reading.add_done_callback(functools.partial(self._done, model))
        await asyncio.shield(reading)  # a client that leaves does not cancel the others' read

    def _done(self, model: str, reading: asyncio.Future[None]) -> None:
        if self._reading.get(model) is reading:
            del self._reading[model]

    async def _read(self, model: str, key: Path) -> None:
        configs: dict[str, dict[str, Any]] = {}
        pending = [model]
        while pending and len(configs) < MAX_CONFIGS_PER_MODEL:
            name = pending.pop(0)
            if name in configs:
                continue
            config = await self.reader.config(name)
            if config is None:
                return
            configs[name] = config
            pending.extend(ensemble_steps(config))
        if self.reader.current(key):  # not a read of an upstream replaced meanwhile
            self.queues.bounds[model] = queue_bounds(model, configs)
