"""Our server as a process of its own for a bench (``python -m tritonforge.runtime serve``), as
the peers' servers are (:class:`tritonforge.loadtest.anchors.local_server.LocalServer`). Started
inside the bench's process instead, the front would share one interpreter lock with the bench's
client threads (16 streams): a cost no deployment pays, measured at 16 streams as ~20% of TTFT
p50 (docs/performance.md, "Our server in its own process")."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from tritonforge.loadtest.anchors.local_server import LocalServer, free_port
from tritonforge.loadtest.errors import LoadtestError


class ServeError(LoadtestError):
    """``tritonforge serve`` exited or was not ready in time (its log's tail in the message)."""


def start_serve(
    model_repository: Path, models: Sequence[str], log_path: Path, ready_timeout_s: float = 600.0
) -> tuple[LocalServer, str]:
    """Serve ``models`` of ``model_repository`` (explicit model control, no supervisor: the
    serving path alone, as ``llama-server`` runs) on free loopback ports, its output in
    ``log_path``; returns the process (``stop()`` it) and its gRPC ``host:port`` once every model
    is ready. :class:`ServeError` when it exits first or is not ready within ``ready_timeout_s``."""
    if not models:
        raise ValueError("start_serve needs at least one model")
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    cmd = [
        sys.executable, "-m", "tritonforge.runtime", "serve", "--quiet", "--no-supervise",
        "--model-repository", str(model_repository.resolve()),
        "--model-control-mode", "explicit", *(a for m in models for a in ("--load-model", m)),
        "--host", "127.0.0.1", "--http-port", str(http_port), "--grpc-port", str(grpc_port),
        "--metrics-port", str(metrics_port),
    ]  # fmt: skip
    server = LocalServer("tritonforge serve", ServeError)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # one model's readiness is every model's: Triton opens its sockets only once every
    # --load-model is loaded, and exits when one fails (then ServeError with its log)
    ready_url = f"http://127.0.0.1:{http_port}/v2/models/{models[-1]}/ready"
    server.start(cmd, log_path, ready_url, ready_timeout_s)
    return server, f"127.0.0.1:{grpc_port}"
