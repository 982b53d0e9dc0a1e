"""Blocking embedding client over tritonclient's HTTP or gRPC client.

tritonclient's HTTP client is gevent-based: an :class:`EmbeddingClient` belongs to the thread that
created it (create one per thread; using it from another thread raises :class:`ClientError`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from types import ModuleType, TracebackType
from typing import Any

import numpy as np

from tritonforge.client.errors import ClientError, ConnectionFailedError
from tritonforge.client.retry import call_with_retry, translate
from tritonforge.client.settings import ClientSettings, route
from tritonforge.client.wire import (
    check_texts,
    chunks,
    decode,
    make_inputs,
    make_outputs,
    trace_headers,
)


def settings_from(settings: ClientSettings | None, overrides: dict[str, Any]) -> ClientSettings:
    """``settings`` (or the environment's) with the non-None ``overrides`` applied."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if settings is None:
        return ClientSettings(**given)
    merged = {**settings.__dict__, **given}
    return ClientSettings(**merged)


class EmbeddingClient:
    """``embed(texts) -> np.ndarray [n, dim]`` (unit-norm rows) against a tritonforge server.

    Arguments override ``settings`` which default to the ``TRITONFORGE_*`` environment (see
    :mod:`client.settings`). Transient failures are retried per the settings' retry policy.
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

    # -- API --------------------------------------------------------------------------------------
    def embed(
        self,
        texts: Sequence[str] | str,
        variant: str | None = None,
        pipeline: str | None = None,
        traceparent: str | None = None,
    ) -> np.ndarray:
        """Embeddings of ``texts``: float32 [n, dim], one unit-norm row per text, in order.

        Texts are sent in requests of at most ``batch_size``, each with a W3C ``traceparent``
        (``traceparent``, else the active OpenTelemetry span's, else a fresh one; the last one sent
        is ``last_traceparent``).
        """
        self._check_thread()
        items = check_texts(texts)
        model, parameters = route(
            pipeline or self.settings.pipeline, variant or self.settings.variant
        )
        context = self._context(model)
        parts = []
        for chunk in chunks(items, self.settings.batch_size):
            headers = trace_headers(traceparent)
            self.last_traceparent = headers["traceparent"]

            def attempt(
                remaining_s: float, chunk: list[str] = chunk, headers: dict[str, str] = headers
            ) -> Any:
                kwargs: dict[str, Any] = {"parameters": parameters} if parameters else {}
                kwargs["headers"] = headers
                if self.settings.protocol == "grpc":
                    kwargs["client_timeout"] = self._timeout(remaining_s)
                return self._client.infer(
                    model,
                    make_inputs(self._module, chunk),
                    outputs=make_outputs(self._module),
                    **kwargs,
                )

            result = call_with_retry(attempt, self.policy, context)
            parts.append(decode(result, len(chunk), context))
        return np.concatenate(parts, axis=0)

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

    def is_model_ready(self, variant: str | None = None, pipeline: str | None = None) -> bool:
        model, _ = route(pipeline or self.settings.pipeline, variant or self.settings.variant)
        return self._probe(lambda **kw: self._client.is_model_ready(model, **kw))

    def metadata(self, variant: str | None = None, pipeline: str | None = None) -> dict[str, Any]:
        """The model's metadata (name, versions, inputs, outputs) as a dict."""
        self._check_thread()
        model, _ = route(pipeline or self.settings.pipeline, variant or self.settings.variant)

        def attempt(remaining_s: float) -> Any:
            if self.settings.protocol == "grpc":
                return self._client.get_model_metadata(
                    model, as_json=True, client_timeout=self._timeout(remaining_s)
                )
            return self._client.get_model_metadata(model)

        return dict(call_with_retry(attempt, self.policy, self._context(model)))

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
