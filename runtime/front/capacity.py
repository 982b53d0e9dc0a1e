"""Each model's bound on open streams, read from its served config: what
:class:`~runtime.front.guard.Admission` bounds a model's streams by (every stream kind asks it
before admission)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path

import aiohttp

from tritonforge.runtime.front.guard import Admission, stream_capacities


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
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        try:
            async with self.session().get(
                f"http://triton/v2/models/{urllib.parse.quote(model)}/config",
                headers=self.admin_headers,
                timeout=timeout,
            ) as resp:
                if resp.status != 200:
                    return
                config = await resp.json(content_type=None)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            return
        capacity = stream_capacities([config]).get(model)
        if capacity is not None:
            self.admission.capacities[model] = capacity
        self._known.add(model)
