"""What the front admits per model, read from the served configs: each model's bound on open
streams (:class:`StreamCapacity`, for :class:`~runtime.front.guard.Admission`; every stream kind
asks it before admission) and the bounded queues its inferences go to (:class:`QueueCapacity`,
for :class:`~runtime.front.queues.QueueAdmission`; an ensemble is refused past its steps')."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp

from tritonforge.runtime.front.guard import Admission, stream_capacities
from tritonforge.runtime.front.queues import QueueAdmission, ensemble_steps, queue_bounds

MAX_CONFIGS_PER_MODEL = 32  # configs read for one model (itself and its ensemble's steps)


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


class StreamCapacity:
    """``await capacity(model)`` reads ``model``'s stream bound (:func:`stream_capacities`) into
    ``admission.capacities``: once per model and upstream socket (a restart reads it again), one
    config read the first time a stream goes to a model, none after. A model that is unknown or
    not loaded keeps ``max_open_streams`` until it is."""

    def __init__(
        self,
        admission: Admission,
        upstream_socket: Callable[[], Path],
        session: Callable[[], aiohttp.ClientSession],
        admin_headers: Mapping[str, str],
        timeout_s: float,
    ) -> None:
        self.admission = admission
        self.upstream_socket = upstream_socket
        self.session = session
        self.admin_headers = dict(admin_headers)
        self.timeout_s = timeout_s
        self._socket: Path | None = None
        self._known: set[str] = set()

    async def __call__(self, model: str) -> None:
        key = self.upstream_socket()
        if self._socket != key:
            self._socket, self._known = key, set()
            self.admission.capacities = {}
        if model in self._known:
            return
        config = await read_config(self.session(), model, self.admin_headers, self.timeout_s)
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
    next time. ``enabled`` False (``FrontLimits.model_queue_admission``): no slot, no read."""

    def __init__(
        self,
        queues: QueueAdmission,
        upstream_socket: Callable[[], Path],
        session: Callable[[], aiohttp.ClientSession],
        admin_headers: Mapping[str, str],
        timeout_s: float,
        enabled: bool = True,
    ) -> None:
        self.queues = queues
        self.upstream_socket = upstream_socket
        self.session = session
        self.admin_headers = dict(admin_headers)
        self.timeout_s = timeout_s
        self.enabled = enabled
        self._socket: Path | None = None
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
        key = self.upstream_socket()
        if self._socket != key:
            self._socket, self._reading = key, {}
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
        session = self.session()
        while pending and len(configs) < MAX_CONFIGS_PER_MODEL:
            name = pending.pop(0)
            if name in configs:
                continue
            config = await read_config(session, name, self.admin_headers, self.timeout_s)
            if config is None:
                return
            configs[name] = config
            pending.extend(ensemble_steps(config))
        if self._socket == key:  # not a read of an upstream replaced meanwhile
            self.queues.bounds[model] = queue_bounds(model, configs)
