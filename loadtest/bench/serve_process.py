"""Our server as a process of its own for a bench (``python -m tritonforge.runtime serve``), as
the peers' servers are (:class:`tritonforge.loadtest.anchors.local_server.LocalServer`). Started
inside the bench's process instead, the front would share one interpreter lock with the bench's
client threads (16 streams): a cost no deployment pays, measured at 16 streams as ~20% of TTFT
p50 (docs/performance.md, "Our server in its own process")."""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tritonforge.loadtest.anchors.local_server import LocalServer, free_port
from tritonforge.loadtest.errors import LoadtestError
from tritonforge.runtime.launcher.settings import ADMIN_KEY_ENV


class ServeError(LoadtestError):
    """``tritonforge serve`` exited or was not ready in time (its log's tail in the message)."""


@dataclass(frozen=True)
class Served:
    """A started ``serve``: ``process`` (``stop()`` it), its front's ``http_url`` and
    ``grpc_url`` (``host:port``, as :class:`tritonforge.runtime.serving.EmbeddedServer`'s) and
    the ``admin_key`` it was given (the model-config and statistics APIs ask for it)."""

    process: LocalServer
    http_url: str
    grpc_url: str
    admin_key: str


def start_serve(
    model_repository: Path, models: Sequence[str], log_path: Path, ready_timeout_s: float = 600.0
) -> Served:
    """Serve ``models`` of ``model_repository`` (explicit model control, no supervisor: the
    serving path alone, as ``llama-server`` runs) on free loopback ports with a new admin key,
    its output in ``log_path``; returned once every model is ready. :class:`ServeError` when it
    exits first or is not ready within ``ready_timeout_s``."""
    if not models:
        raise ValueError("start_serve needs at least one model")
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    cmd = [
        sys.executable, "-m", "tritonforge.runtime", "serve", "--quiet", "--no-supervise",
        "--model-repository", str(model_repository.resolve()),
        "--model-control-mode", "explicit", *(a for m in models for a in ("--load-model", m)),
        "--host", "127.0.0.1", "--http-port", str(http_port), "--grpc-port", str(grpc_port),
        "--metrics-port", str(metrics_port), "--health-port", "0",
    ]  # fmt: skip
    server = LocalServer("tritonforge serve", ServeError)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # one model's readiness is every model's: Triton opens its sockets only once every
    # --load-model is loaded, and exits when one fails (then ServeError with its log)
    ready_url = f"http://127.0.0.1:{http_port}/v2/models/{models[-1]}/ready"
    admin_key = secrets.token_urlsafe(18)
    env = {**os.environ, ADMIN_KEY_ENV: admin_key}
    server.start(cmd, log_path, ready_url, ready_timeout_s, env=env)
    return Served(server, f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", admin_key)
