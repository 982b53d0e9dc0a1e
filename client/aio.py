"""Asyncio embedding client over ``tritonclient.http.aio`` or ``tritonclient.grpc.aio``.

Same contract as :class:`client.sync.EmbeddingClient`; use it from one event loop
(``async with AsyncEmbeddingClient(...) as c: await c.embed([...])``).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType, TracebackType
from typing import Any

import numpy as np

from tritonforge.client.errors import ConnectionFailedError
from tritonforge.client.retry import call_with_retry_async, translate
from tritonforge.client.settings import ClientSettings, route
from tritonforge.client.sync import settings_from
from tritonforge.client.wire import (
    check_texts,
    chunks,
    decode,
    make_inputs,
    make_outputs,
    trace_headers,
)


class AsyncEmbeddingClient:
    """``await embed(texts) -> np.ndarray [n, dim]``; transient failures are retried."""

    def __init__(
        self,
        url: str | None = None,
        protocol: str | None = None,
        *,
        timeout_s: float | None = None,
        max_attempts: int | None = None,
        deadline_s: float | None = None,
        variant: str | None = None,
        pipeline: str | None = None,
        batch_size: int | None = None,
        settings: ClientSettings | None = None,
    ) -> None:
        self.settings = settings_from(
            settings,
            {
                "url": url,
                "protocol": protocol,
                "timeout_s": timeout_s,
                "max_attempts": max_attempts,
                "deadline_s": deadline_s,
                "variant": variant,
                "pipeline": pipeline,
                "batch_size": batch_size,
            },
        )
        self.policy = self.settings.retry_policy()
        self.last_traceparent: str | None = None
        self._module: ModuleType
        self._client: Any = None

    def _connect(self) -> Any:
        # Created lazily: aiohttp's session must be made inside the running event loop.
        if self._client is None:
            if self.settings.protocol == "http":
                import tritonclient.http as module
                import tritonclient.http.aio as aio

                self._client = aio.InferenceServerClient(
                    self.settings.address, conn_timeout=self.settings.timeout_s
                )
            else:
                import tritonclient.grpc as module
                import tritonclient.grpc.aio as aio

                self._client = aio.InferenceServerClient(self.settings.address)
            self._module = module
        return self._client

    def _context(self, model: str | None = None) -> str:
        s = self.settings
        target = f"model {model!r} at " if model else ""
        return f"{target}{s.protocol}://{s.address} (timeout {s.timeout_s:g} s)"

    def _grpc_timeout(self, remaining_s: float) -> dict[str, float]:
        if self.settings.protocol != "grpc":
            return {}
        return {"client_timeout": max(0.001, min(self.settings.timeout_s, remaining_s))}

    async def embed(
        self,
        texts: Sequence[str] | str,
        variant: str | None = None,
        pipeline: str | None = None,
        traceparent: str | None = None,
    ) -> np.ndarray:
        """Embeddings of ``texts``: float32 [n, dim], one unit-norm row per text, in order; each
        request carries a W3C ``traceparent`` (see :meth:`client.sync.EmbeddingClient.embed`)."""
        items = check_texts(texts)
        model, parameters = route(
            pipeline or self.settings.pipeline, variant or self.settings.variant
        )
        context = self._context(model)
        client = self._connect()
        parts = []
        for chunk in chunks(items, self.settings.batch_size):
            headers = trace_headers(traceparent)
            self.last_traceparent = headers["traceparent"]

            async def attempt(
                remaining_s: float, chunk: list[str] = chunk, headers: dict[str, str] = headers
            ) -> Any:
                kwargs: dict[str, Any] = {"parameters": parameters} if parameters else {}
                kwargs["headers"] = headers
                kwargs.update(self._grpc_timeout(remaining_s))
                return await client.infer(
                    model,
                    make_inputs(self._module, chunk),
                    outputs=make_outputs(self._module),
                    **kwargs,
                )

            result = await call_with_retry_async(attempt, self.policy, context)
            parts.append(decode(result, len(chunk), context))
        return np.concatenate(parts, axis=0)

    async def _probe(self, name: str, *args: str) -> bool:
        client = self._connect()
        try:
            return bool(await getattr(client, name)(*args, **self._grpc_timeout(1e9)))
        except BaseException as e:
            err = translate(e, self._context())
            if isinstance(err, ConnectionFailedError):
                return False
            raise err from e

    async def is_live(self) -> bool:
        """Server liveness; False when it cannot be reached."""
        return await self._probe("is_server_live")

    async def is_ready(self) -> bool:
        """Server readiness; False when it cannot be reached."""
        return await self._probe("is_server_ready")

    async def is_model_ready(self, variant: str | None = None, pipeline: str | None = None) -> bool:
        model, _ = route(pipeline or self.settings.pipeline, variant or self.settings.variant)
        return await self._probe("is_model_ready", model)

    async def metadata(
        self, variant: str | None = None, pipeline: str | None = None
    ) -> dict[str, Any]:
        """The model's metadata (name, versions, inputs, outputs) as a dict."""
        model, _ = route(pipeline or self.settings.pipeline, variant or self.settings.variant)
        client = self._connect()

        async def attempt(remaining_s: float) -> Any:
            if self.settings.protocol == "grpc":
                return await client.get_model_metadata(
                    model, as_json=True, **self._grpc_timeout(remaining_s)
                )
            return await client.get_model_metadata(model)

        return dict(await call_with_retry_async(attempt, self.policy, self._context(model)))

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def __aenter__(self) -> AsyncEmbeddingClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
