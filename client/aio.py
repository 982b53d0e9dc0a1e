"""Asyncio embedding and classification client over ``tritonclient.http.aio`` or ``.grpc.aio``.

Same contract as :class:`client.sync.EmbeddingClient` (both are shells over
:class:`client.core.BaseClient`); use it from one event loop
(``async with AsyncEmbeddingClient(...) as c: await c.embed([...])``).
"""

from __future__ import annotations

from typing import Any, Literal

from tritonforge.client.core import BaseClient, Call
from tritonforge.client.retry import call_with_retry_async


class AsyncEmbeddingClient(BaseClient):
    """``await embed(texts) -> np.ndarray [n, dim]``, ``await classify(texts)``; transient
    failures are retried. Arguments as :class:`client.core.BaseClient`."""

    asynchronous: Literal[True] = True

    def _open(self) -> None:
        self._client: Any = None

    def _connect(self) -> Any:
        # Created lazily: aiohttp's session must be made inside the running event loop.
        if self._client is None:
            s = self.settings
            if s.protocol == "http":
                import tritonclient.http.aio as http_aio

                self._client = http_aio.InferenceServerClient(s.address, conn_timeout=s.timeout_s)
            else:
                import tritonclient.grpc.aio as grpc_aio

                self._client = grpc_aio.InferenceServerClient(s.address)
        return self._client

    async def _send(self, call: Call) -> Any:
        attempt = self._attempt(self._connect(), call)
        if not call.retried:
            return await attempt(self.settings.timeout_s)
        return await call_with_retry_async(
            attempt, self.policy, breaker=self.breaker, context=call.context
        )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def __aenter__(self) -> AsyncEmbeddingClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()
