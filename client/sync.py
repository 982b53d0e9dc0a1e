"""Blocking embedding and classification client over tritonclient's HTTP or gRPC client.

Model names, variants, output names and dims, labels and limits are discovered from the server
(:mod:`client.discovery`) on first use and cached (``pipelines(refresh=True)`` re-reads them).

tritonclient's HTTP client is gevent-based: an :class:`EmbeddingClient` belongs to the thread that
created it (create one per thread; using it from another thread raises :class:`ClientError`).
"""

from __future__ import annotations

import threading
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
from tritonforge.client.errors import (
    ClientError,
    ConnectionFailedError,
    InvalidRequestError,
    ModelNotFoundError,
)
from tritonforge.client.retry import call_with_retry, translate
from tritonforge.client.settings import ClientSettings
from tritonforge.client.wire import (
    check_texts,
    chunks,
    decode,
    make_inputs,
    make_outputs,
    trace_headers,
)
from tritonforge.pipelines import Pipeline

SETTING_ARGS = (
    "url",
    "protocol",
    "timeout_s",
    "max_attempts",
    "deadline_s",
    "variant",
    "pipeline",
    "batch_size",
    "name",
    "admin_key",
    "repository",
)


def settings_from(settings: ClientSettings | None, overrides: dict[str, Any]) -> ClientSettings:
    """``settings`` (or the environment's) with the non-None ``overrides`` applied."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if settings is None:
        return ClientSettings(**given)
    merged = {**settings.__dict__, **given}
    return ClientSettings(**merged)


class EmbeddingClient:
    """``embed(texts) -> np.ndarray [n, dim]`` (unit-norm rows) and ``classify(texts) ->
    [Classification]`` against a tritonforge server.

    Arguments override ``settings`` which default to the ``TRITONFORGE_*`` environment (see
    :mod:`client.settings`): ``pipeline`` is the orchestration (ensemble | bls), ``name`` the
    pipeline (default: the discovered default of the task). Transient failures are retried per
    the settings' retry policy.
    """

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
        self._owner = threading.get_ident()
        self._module: ModuleType
        if self.settings.protocol == "http":
            import tritonclient.http as module

            self._client: Any = module.InferenceServerClient(
                self.settings.address,
                connection_timeout=self.settings.timeout_s,
                network_timeout=self.settings.timeout_s,
            )
        else:
            import tritonclient.grpc as module

            self._client = module.InferenceServerClient(self.settings.address)
        self._module = module

    # -- plumbing ---------------------------------------------------------------------------------
    def _context(self, model: str | None = None) -> str:
        s = self.settings
        target = f"model {model!r} at " if model else ""
        return f"{target}{s.protocol}://{s.address} (timeout {s.timeout_s:g} s)"

    def _check_thread(self) -> None:
        if threading.get_ident() != self._owner:
            raise ClientError(
                "EmbeddingClient used from a thread other than the one that created it; "
                "tritonclient's HTTP client is gevent-based: create one client per thread"
            )

    def _timeout(self, remaining_s: float) -> float:
        return max(0.001, min(self.settings.timeout_s, remaining_s))

    # -- discovery --------------------------------------------------------------------------------
    def _grpc_kw(self, remaining_s: float) -> dict[str, Any]:
        if self.settings.protocol != "grpc":
            return {}
        return {"client_timeout": self._timeout(remaining_s)}

    def _fetch_configs(self) -> list[dict[str, Any]]:
        headers = admin_headers(self.settings.protocol, self.settings.admin_key)
        grpc = self.settings.protocol == "grpc"
        extra: dict[str, Any] = {"as_json": True} if grpc else {}

        def index(remaining_s: float) -> Any:
            return self._client.get_model_repository_index(
                headers=headers, **extra, **self._grpc_kw(remaining_s)
            )

        configs = []
        for model in index_names(
            call_with_retry(index, self.policy, breaker=self.breaker, context=self._context())
        ):

            def config(remaining_s: float, model: str = model) -> Any:
                return self._client.get_model_config(
                    model, headers=headers, **self._grpc_kw(remaining_s)
                )

            try:
                got = call_with_retry(
                    config, self.policy, breaker=self.breaker, context=self._context(model)
                )
            except ModelNotFoundError:  # unloaded since the index was read
                continue
            configs.append(grpc_config(got) if grpc else dict(got))
        return configs

    def pipelines(self, refresh: bool = False) -> dict[str, Pipeline]:
        """The server's pipelines by name (discovered once, then cached; see
        :mod:`client.discovery` for the sources)."""
        self._check_thread()
        if self._pipelines is None or refresh:
            explicit = configured_repository(self.settings.repository)
            if explicit is not None:
                self._pipelines = offline(explicit)
            else:
                try:
                    configs = self._fetch_configs()
                except InvalidRequestError as e:
                    self._pipelines = fallback(e, self._context())
                else:
                    self._pipelines = served(configs, self._context())
        return self._pipelines

    def resolve(
        self, task: str, name: str | None, pipeline: str | None, variant: str | None
    ) -> tuple[Pipeline, str, dict[str, str]]:
        s = self.settings
        return select(
            self.pipelines(), task, name or s.name, pipeline or s.pipeline, variant or s.variant
        )

    def _infer(
        self,
        model: str,
        inputs: list[Any],
        outputs: list[Any],
        parameters: dict[str, Any],
        headers: dict[str, str],
        extra: dict[str, Any] | None = None,
    ) -> Any:
        context = self._context(model)

        def attempt(remaining_s: float) -> Any:
            kwargs: dict[str, Any] = {"parameters": parameters} if parameters else {}
            kwargs.update(extra or {}, headers=headers, **self._grpc_kw(remaining_s))
            return self._client.infer(model, inputs, outputs=outputs, **kwargs)

        return call_with_retry(attempt, self.policy, breaker=self.breaker, context=context)

    # -- API --------------------------------------------------------------------------------------
    def embed(
        self,
        texts: Sequence[str] | str,
        variant: str | None = None,
        pipeline: str | None = None,
        traceparent: str | None = None,
        name: str | None = None,
    ) -> np.ndarray:
        """Embeddings of ``texts``: float32 [n, dim], one unit-norm row per text, in order.

        Texts are sent in requests of at most ``batch_size`` (and the pipeline's ``max_items``),
        each with a W3C ``traceparent`` (``traceparent``, else the active OpenTelemetry span's,
        else a fresh one; the last one sent is ``last_traceparent``).
        """
        self._check_thread()
        items = check_texts(texts)
        target, model, parameters = self.resolve("embedding", name, pipeline, variant)
        outputs = make_outputs(self._module, [target.outputs[0].name])
        parts = []
        for chunk in chunks(items, min(self.settings.batch_size, target.max_items)):
            headers = trace_headers(traceparent)
            self.last_traceparent = headers["traceparent"]
            inputs = make_inputs(self._module, chunk, target.input)
            result = self._infer(model, inputs, outputs, parameters, headers)
            parts.append(decode(result, target, len(chunk), self._context(model)))
        return np.concatenate(parts, axis=0)

    def classify(
        self,
        texts: Sequence[str] | str,
        top_k: int | None = None,
        version: int | str | None = None,
        variant: str | None = None,
        pipeline: str | None = None,
        name: str | None = None,
        traceparent: str | None = None,
    ) -> list[Classification]:
        """One :class:`Classification` per text, in order (at most the pipeline's ``max_items``
        texts: one request). ``top_k`` (1..classes) sizes ``top``; ``version`` pins a model
        version (the BLS's ``version`` parameter; an ensemble's ``model_version``)."""
        self._check_thread()
        items = check_texts(texts)
        target, model, parameters = self.resolve("classification", name, pipeline, variant)
        k, extra_params, extra = classification.prepare(
            target, items, pipeline or self.settings.pipeline, top_k, version
        )
        headers = trace_headers(traceparent)
        self.last_traceparent = headers["traceparent"]
        result = self._infer(
            model,
            make_inputs(self._module, items, target.input),
            make_outputs(self._module, classification.output_names(target, model)),
            {**parameters, **extra_params},
            headers,
            extra,
        )
        return classification.decode(result, target, len(items), k, self._context(model))

    def _probe(self, call: Any) -> bool:
        self._check_thread()
        kwargs = (
            {"client_timeout": self.settings.timeout_s} if self.settings.protocol == "grpc" else {}
        )
        try:
            return bool(call(**kwargs))
        except BaseException as e:
            err = translate(e, self._context())
            if isinstance(err, ConnectionFailedError):
                return False
            raise err from e

    def is_live(self) -> bool:
        """Server liveness; False when it cannot be reached."""
        return self._probe(self._client.is_server_live)

    def is_ready(self) -> bool:
        """Server readiness (every model loaded); False when it cannot be reached."""
        return self._probe(self._client.is_server_ready)

    def is_model_ready(
        self,
        variant: str | None = None,
        pipeline: str | None = None,
        name: str | None = None,
        task: str = "embedding",
    ) -> bool:
        _, model, _ = self.resolve(task, name, pipeline, variant)
        return self._probe(lambda **kw: self._client.is_model_ready(model, **kw))

    def metadata(
        self,
        variant: str | None = None,
        pipeline: str | None = None,
        name: str | None = None,
        task: str = "embedding",
    ) -> dict[str, Any]:
        """The model's metadata (name, versions, inputs, outputs) as a dict."""
        self._check_thread()
        _, model, _ = self.resolve(task, name, pipeline, variant)

        def attempt(remaining_s: float) -> Any:
            if self.settings.protocol == "grpc":
                return self._client.get_model_metadata(
                    model, as_json=True, client_timeout=self._timeout(remaining_s)
                )
            return self._client.get_model_metadata(model)

        return dict(
            call_with_retry(
                attempt, self.policy, breaker=self.breaker, context=self._context(model)
            )
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> EmbeddingClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
