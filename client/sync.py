"""Blocking embedding and classification client over tritonclient's HTTP or gRPC client.

A thin shell over :class:`client.core.BaseClient`, which builds the requests, discovers, decodes
and wires the retries; this module only sends the calls. Model names, variants, output names and
dims, labels and limits are discovered from the server (:mod:`client.discovery`) on first use and
cached (``pipelines(refresh=True)`` re-reads them).

tritonclient's HTTP client is gevent-based: an :class:`EmbeddingClient` belongs to the thread that
created it (create one per thread; using it from another thread raises :class:`ClientError`).
"""

from __future__ import annotations

import threading
from typing import Any, Literal

from tritonforge.client.core import (
    SETTING_ARGS,
    BaseClient,
    Call,
    settings_from,
)
from tritonforge.client.errors import ClientError
from tritonforge.client.retry import call_with_retry

# SETTING_ARGS and settings_from live in client.core; re-exported from here, their old home
__all__ = ["SETTING_ARGS", "EmbeddingClient", "settings_from"]


class EmbeddingClient(BaseClient):
    """``embed(texts) -> np.ndarray [n, dim]`` (unit-norm rows) and ``classify(texts) ->
    [Classification]`` against a tritonforge server; arguments as :class:`BaseClient`."""

    asynchronous: Literal[False] = False

    def _open(self) -> None:
        self._owner = threading.get_ident()
        s = self.settings
        if s.protocol == "http":
            self._client: Any = self._module.InferenceServerClient(
                s.address, connection_timeout=s.timeout_s, network_timeout=s.timeout_s
            )
        else:
            self._client = self._module.InferenceServerClient(s.address)

    def _check_call(self) -> None:
        if threading.get_ident() != self._owner:
            raise ClientError(
                "EmbeddingClient used from a thread other than the one that created it; "
                "tritonclient's HTTP client is gevent-based: create one client per thread"
            )

    async def _send(self, call: Call) -> Any:
        # blocks (never suspends): the blocking methods run the core's drive with finish()
        attempt = self._attempt(self._client, call)
        if not call.retried:
            return attempt(self.settings.timeout_s)
        return call_with_retry(attempt, self.policy, breaker=self.breaker, context=call.context)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> EmbeddingClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
