"""Our server as a process of its own for a bench (``python -m tritonforge.runtime serve``), as
the peers' servers are (:class:`tritonforge.loadtest.anchors.local_server.LocalServer`). Started
inside the bench's process instead, the front would share one interpreter lock with the bench's
client threads (16 streams): a cost no deployment pays, measured at 16 streams as ~20% of TTFT
p50 (docs/performance.md, "Our server in its own process")."""

from __future__ import annotations

import os
import re
import secrets
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tritonforge.loadtest.anchors.local_server import LocalServer
from tritonforge.loadtest.errors import LoadtestError
from tritonforge.runtime.launcher.settings import ADMIN_KEY_ENV

# the line serve logs once its ports are bound (runtime/cli/main.py)
LISTENING = re.compile(r"==> listening: HTTP (\S+) gRPC (\S+) ")


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
    serving path alone, as ``llama-server`` runs) on loopback ports it binds with a new admin key,
    its output in ``log_path``; returned once every model is ready. :class:`ServeError` when it
    exits first or is not ready within ``ready_timeout_s``."""
    if not models:
        raise ValueError("start_serve needs at least one model")
    # port 0: serve binds free ports itself and says which (no port picked here and released
    # first, which another process could take before serve binds it)
    cmd = [
        sys.executable, "-m", "tritonforge.runtime", "serve", "--quiet", "--no-supervise",
        "--model-repository", str(model_repository.resolve()),
        "--model-control-mode", "explicit", *(a for m in models for a in ("--load-model", m)),
        "--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
        "--health-port", "0",
    ]  # fmt: skip
    server = LocalServer("tritonforge serve", ServeError)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    bound: list[str] = []  # [http, grpc] once its log says

    def ready_url() -> str | None:
        if not bound and (found := LISTENING.search(log_path.read_text(errors="replace"))):
            bound.extend(found.groups())
        # one model's readiness is every model's: Triton opens its sockets only once every
        # --load-model is loaded, and exits when one fails (then ServeError with its log)
        return f"http://{bound[0]}/v2/models/{models[-1]}/ready" if bound else None

    admin_key = secrets.token_urlsafe(18)
    env = {**os.environ, ADMIN_KEY_ENV: admin_key}
    server.start(cmd, log_path, ready_url, ready_timeout_s, env=env)
    return Served(server, bound[0], bound[1], admin_key)
