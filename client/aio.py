"""Asyncio embedding and classification client over ``tritonclient.http.aio`` or ``.grpc.aio``.

Same contract as :class:`client.sync.EmbeddingClient`; use it from one event loop
(``async with AsyncEmbeddingClient(...) as c: await c.embed([...])``).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType, TracebackType
from typing import Any

import numpy as np

from tritonforge.client import classification
from tritonforge.client.breaker import CircuitBreaker
from tritonforge.client.classification import Classification
from tritonforge.client.discovery import (
    admin_headers,
    configured_repository,
    fallback,
    grpc_config,
    index_names,
    offline,
    select,
    served,
)
from tritonforge.client.errors import ConnectionFailedError, InvalidRequestError, ModelNotFoundError
from tritonforge.client.retry import call_with_retry_async, translate
from tritonforge.client.settings import ClientSettings
from tritonforge.client.sync import SETTING_ARGS, settings_from
from tritonforge.client.wire import (
    check_texts,
    chunks,
    decode,
    make_inputs,
    make_outputs,
    trace_headers,
)
from tritonforge.pipelines import Pipeline


class AsyncEmbeddingClient:
    """``await embed(texts) -> np.ndarray [n, dim]``, ``await classify(texts)``; transient
    failures are retried."""

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
        name: str | None = None,
        admin_key: str | None = None,
        repository: str | None = None,
        settings: ClientSettings | None = None,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        given = dict(locals())
        self.settings = settings_from(settings, {k: given[k] for k in SETTING_ARGS})
        self.policy = self.settings.retry_policy()
        self.breaker = breaker or self.settings.circuit_breaker()
        self.last_traceparent: str | None = None
        self._pipelines: dict[str, Pipeline] | None = None
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

    async def _fetch_configs(self) -> list[dict[str, Any]]:
        client = self._connect()
        headers = admin_headers(self.settings.protocol, self.settings.admin_key)
        grpc = self.settings.protocol == "grpc"
        extra: dict[str, Any] = {"as_json": True} if grpc else {}

        async def index(remaining_s: float) -> Any:
            return await client.get_model_repository_index(
                headers=headers, **extra, **self._grpc_timeout(remaining_s)
            )

        names = index_names(
            await call_with_retry_async(
                index, self.policy, breaker=self.breaker, context=self._context()
            )
        )
        configs = []
        for model in names:

            async def config(remaining_s: float, model: str = model) -> Any:
                return await client.get_model_config(
                    model, headers=headers, **self._grpc_timeout(remaining_s)
                )

            try:
                got = await call_with_retry_async(
                    config, self.policy, breaker=self.breaker, context=self._context(model)
                )
            except ModelNotFoundError:  # unloaded since the index was read
                continue
            configs.append(grpc_config(got) if grpc else dict(got))
        return configs

    async def pipelines(self, refresh: bool = False) -> dict[str, Pipeline]:
        """The server's pipelines by name (discovered once, then cached)."""
        if self._pipelines is None or refresh:
            explicit = configured_repository(self.settings.repository)
            if explicit is not None:
                self._pipelines = offline(explicit)
            else:
                try:
                    configs = await self._fetch_configs()
                except InvalidRequestError as e:
                    self._pipelines = fallback(e, self._context())
                else:
                    self._pipelines = served(configs, self._context())
        return self._pipelines

    async def resolve(
        self, task: str, name: str | None, pipeline: str | None, variant: str | None
    ) -> tuple[Pipeline, str, dict[str, str]]:
        s = self.settings
        return select(
            await self.pipelines(),
            task,
            name or s.name,
            pipeline or s.pipeline,
            variant or s.variant,
        )

    async def _infer(
        self,
        model: str,
        inputs: list[Any],
        outputs: list[Any],
        parameters: dict[str, Any],
        headers: dict[str, str],
        extra: dict[str, Any] | None = None,
    ) -> Any:
        client = self._connect()

        async def attempt(remaining_s: float) -> Any:
            kwargs: dict[str, Any] = {"parameters": parameters} if parameters else {}
            kwargs.update(extra or {}, headers=headers, **self._grpc_timeout(remaining_s))
            return await client.infer(model, inputs, outputs=outputs, **kwargs)

        return await call_with_retry_async(
            attempt, self.policy, breaker=self.breaker, context=self._context(model)
        )

    async def embed(
        self,
        texts: Sequence[str] | str,
        variant: str | None = None,
        pipeline: str | None = None,
        traceparent: str | None = None,
        name: str | None = None,
    ) -> np.ndarray:
        """Embeddings of ``texts``: float32 [n, dim], one unit-norm row per text, in order; each
        request carries a W3C ``traceparent`` (see :meth:`client.sync.EmbeddingClient.embed`)."""
        items = check_texts(texts)
        target, model, parameters = await self.resolve("embedding", name, pipeline, variant)
        outputs = make_outputs(self._module, [target.outputs[0].name])
        parts = []
        for chunk in chunks(items, min(self.settings.batch_size, target.max_items)):
            headers = trace_headers(traceparent)
            self.last_traceparent = headers["traceparent"]
            inputs = make_inputs(self._module, chunk, target.input)
            result = await self._infer(model, inputs, outputs, parameters, headers)
            parts.append(decode(result, target, len(chunk), self._context(model)))
        return np.concatenate(parts, axis=0)

    async def classify(
        self,
        texts: Sequence[str] | str,
        top_k: int | None = None,
        version: int | str | None = None,
        variant: str | None = None,
        pipeline: str | None = None,
        name: str | None = None,
        traceparent: str | None = None,
    ) -> list[Classification]:
        """See :meth:`client.sync.EmbeddingClient.classify`."""
        items = check_texts(texts)
        target, model, parameters = await self.resolve("classification", name, pipeline, variant)
        k, extra_params, extra = classification.prepare(
            target, items, pipeline or self.settings.pipeline, top_k, version
        )
        headers = trace_headers(traceparent)
        self.last_traceparent = headers["traceparent"]
        result = await self._infer(
            model,
            make_inputs(self._module, items, target.input),
            make_outputs(self._module, classification.output_names(target, model)),
            {**parameters, **extra_params},
            headers,
            extra,
        )
        return classification.decode(result, target, len(items), k, self._context(model))

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

    async def is_model_ready(
        self,
        variant: str | None = None,
        pipeline: str | None = None,
        name: str | None = None,
        task: str = "embedding",
    ) -> bool:
        _, model, _ = await self.resolve(task, name, pipeline, variant)
        return await self._probe("is_model_ready", model)

    async def metadata(
        self,
        variant: str | None = None,
        pipeline: str | None = None,
        name: str | None = None,
        task: str = "embedding",
    ) -> dict[str, Any]:
        """The model's metadata (name, versions, inputs, outputs) as a dict."""
        _, model, _ = await self.resolve(task, name, pipeline, variant)
        client = self._connect()

        async def attempt(remaining_s: float) -> Any:
            if self.settings.protocol == "grpc":
                return await client.get_model_metadata(
                    model, as_json=True, **self._grpc_timeout(remaining_s)
                )
            return await client.get_model_metadata(model)

        return dict(
            await call_with_retry_async(
                attempt, self.policy, breaker=self.breaker, context=self._context(model)
            )
        )

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
