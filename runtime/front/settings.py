"""The front's settings: its bounds (:class:`FrontLimits`), where Triton's private sockets are,
and the ``/v1`` (OpenAI-compatible) settings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

OPENAI_KEY_ENV = "TRITONFORGE_OPENAI_API_KEY"  # when set, /v1 needs `Authorization: Bearer`
# Triton's private sockets in the socket directory: ``--grpc-address=unix:<dir>/grpc.sock`` listens
# on ``grpc.sock:<--grpc-port>`` (2.51 appends the port to the path); the HTTP socket is exact.
HTTP_SOCKET = "http.sock"
GRPC_SOCKET = "grpc.sock"
GRPC_SOCKET_PORT = 1


def http_socket(socket_dir: Path) -> Path:
    """Triton's HTTP socket in ``socket_dir``."""
    return socket_dir / HTTP_SOCKET


def grpc_target(socket_dir: Path) -> str:
    """The gRPC channel target of Triton's socket in ``socket_dir``."""
    return f"unix:{socket_dir}/{GRPC_SOCKET}:{GRPC_SOCKET_PORT}"


def triton_listen_args(socket_dir: Path) -> list[str]:
    """tritonserver flags that make it listen (HTTP and gRPC) only on sockets in ``socket_dir``:
    the launcher's, and those of the container deployments (checked by deploy/validate/launcher.py)."""
    return [
        f"--http-address=unix:{http_socket(socket_dir)}",
        "--http-port=1",
        f"--grpc-address=unix:{socket_dir}/{GRPC_SOCKET}",
        f"--grpc-port={GRPC_SOCKET_PORT}",
    ]


@dataclass(frozen=True)
class FrontLimits:
    """What the front bounds. ``max_body_bytes`` applies to the body as sent and inflated."""

    max_body_bytes: int = 2 * 1024 * 1024
    max_json_depth: int = 32
    request_timeout_s: float = 60.0
    queue_timeout_s: float = 10.0
    # Short requests in flight to Triton at once. Not a queue of its own: it must hold what the
    # models' queues and executing instances can (tests/unit/test_front_pool.py checks the specs),
    # so that Triton's bounded queues refuse a peak at once (503 "Exceeds maximum queue size")
    # and the BLS sees the backlog it degrades on. At 64 a 3x peak of 1-text requests waited
    # here for a connection (up to ``queue_timeout_s``): p50 3.3 s vs 0.8 s direct (issue #24).
    max_upstream_connections: int = 512
    idle_timeout_s: float = 75.0
    # On drain, gRPC calls in flight (open generation streams) get this long to finish before the
    # old upstream channel is closed; short against Triton's exit timeout, since a client that
    # keeps an idle stream open would otherwise hold tritonserver's shutdown.
    drain_grace_s: float = 10.0
    # Long-lived streams (SSE generate_stream, gRPC ModelStreamInfer, /v1 streams) open at once
    # per model: each model holds at most min(this, max_running + max_queue of its config)
    # (runtime.front.guard.Admission); past it a new stream gets 503 / UNAVAILABLE naming the
    # model. Streams go over Triton's gRPC, so short requests keep max_upstream_connections.
    max_open_streams: int = 64
    # The front's listen backlog (connections accepted by the kernel, not yet by the front). At
    # the default a 500-connection burst overflows it and the excess waits for SYN retries (1,
    # 3, 7 s); the burst test raises it so that every request reaches the front at once.
    listen_backlog_connections: int = 128
    # Inferences of an ensemble (v2 /infer, gRPC ModelInfer, the /v1 routes that infer) let
    # through at once: at most the max_queue_size of each step's queue (on the step's default
    # priority level), read from the served configs (runtime.front.queues); past it 503 /
    # UNAVAILABLE naming the model and the queue. Works around Triton 2.51 leaving an ensemble
    # request its step refused for a full queue unanswered (core#466). False: no such bound.
    model_queue_admission: bool = True


@dataclass(frozen=True)
class OpenAISettings:
    """``model_repository``: where the served tokenizers and chat templates are read from (for
    ``usage`` counts and ``messages``). ``api_key``: when set, ``/v1`` needs
    ``Authorization: Bearer <key>``. ``catalog_ttl_s``: how long the model list read from Triton
    is reused."""

    model_repository: Path
    api_key: str | None = None
    catalog_ttl_s: float = 5.0


def openai_settings(
    model_repository: Path | None, api_key: str | None = None
) -> OpenAISettings | None:
    """The ``/v1`` settings for a front serving ``model_repository`` (None: no ``/v1``)."""
    if model_repository is None:
        return None
    return OpenAISettings(Path(model_repository), api_key=api_key or None)
