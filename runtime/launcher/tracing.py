"""OpenTelemetry tracing of the served pipelines, built on Triton's ``--trace-config``.

Triton 2.51 in ``mode=opentelemetry`` exports one span per request and per model stage (ensemble
steps and BLS calls included, with a ``compute`` child each) over OTLP/HTTP, JSON-encoded, to
``<url>``; it honours an incoming W3C ``traceparent`` header (HTTP) or metadata key (gRPC), so a
client span parents the server's ``InferRequest`` span. Tracing costs a little per request:
``rate`` samples one request in ``rate``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from tritonforge.runtime.errors import EmbeddedServerError

TRACE_ENV = "TRITONFORGE_TRACE_OTLP"
TRACE_RATE_ENV = "TRITONFORGE_TRACE_RATE"
OTLP_TRACES_PATH = "/v1/traces"
TRACE_LEVELS = ("TIMESTAMPS", "TENSORS", "OFF")


class TraceConfigError(EmbeddedServerError):
    """A tracing setting cannot be used (bad endpoint or rate)."""


@dataclass(frozen=True)
class TraceSettings:
    """Where and how often Triton exports spans.

    ``endpoint`` is ``HOST:PORT`` (``/v1/traces`` is appended) or a full ``http(s)://`` URL.
    ``schedule_delay_ms`` is the OpenTelemetry batch span processor's export delay.
    """

    endpoint: str
    rate: int = 1
    level: str = "TIMESTAMPS"
    service_name: str = "tritonforge"
    schedule_delay_ms: int = 1000

    def __post_init__(self) -> None:
        if self.rate < 1:
            raise TraceConfigError(f"trace rate must be >= 1 (one request in N), got {self.rate}")
        if self.level not in TRACE_LEVELS:
            raise TraceConfigError(f"trace level must be one of {TRACE_LEVELS}, got {self.level!r}")
        self.url  # noqa: B018 - validates the endpoint

    @property
    def url(self) -> str:
        """The OTLP/HTTP traces URL Triton posts to."""
        endpoint = self.endpoint.strip()
        if endpoint.startswith(("http://", "https://")):
            return (
                endpoint
                if endpoint.rstrip("/").endswith(OTLP_TRACES_PATH)
                else (endpoint.rstrip("/") + OTLP_TRACES_PATH)
            )
        host, sep, port = endpoint.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise TraceConfigError(
                f"--trace-otlp / ${TRACE_ENV} must be HOST:PORT (an OTLP/HTTP receiver, e.g. "
                f"localhost:4318) or an http(s):// URL, got {self.endpoint!r}"
            )
        return f"http://{host}:{port}{OTLP_TRACES_PATH}"

    def triton_args(self) -> list[str]:
        """tritonserver arguments that turn the tracing on."""
        return [
            "--trace-config=mode=opentelemetry",
            f"--trace-config=opentelemetry,url={self.url}",
            f"--trace-config=opentelemetry,resource=service.name={self.service_name}",
            f"--trace-config=opentelemetry,bsp_schedule_delay={self.schedule_delay_ms}",
            f"--trace-config=rate={self.rate}",
            f"--trace-config=level={self.level}",
            "--trace-config=count=-1",
        ]


def tracing_enabled(triton_args: Sequence[str]) -> bool:
    """Whether these tritonserver arguments export OpenTelemetry spans."""
    return "--trace-config=mode=opentelemetry" in triton_args


def trace_args(endpoint: str | None, rate: int | None = None) -> list[str]:
    """tritonserver arguments for ``serve --trace-otlp`` (``$TRITONFORGE_TRACE_OTLP``,
    ``$TRITONFORGE_TRACE_RATE``); empty when no endpoint is set."""
    endpoint = endpoint or os.environ.get(TRACE_ENV) or None
    if endpoint is None:
        return []
    if rate is None:
        raw = os.environ.get(TRACE_RATE_ENV) or "1"
        if not raw.isdigit():
            raise TraceConfigError(f"${TRACE_RATE_ENV} must be a positive integer, got {raw!r}")
        rate = int(raw)
    return TraceSettings(endpoint=endpoint, rate=rate).triton_args()
