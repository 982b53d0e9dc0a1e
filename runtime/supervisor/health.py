"""The pipeline health: its snapshot (:class:`Health`) and the ``GET /health/pipeline`` port
that reports it to load balancers (:class:`HealthEndpoint`)."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Protocol

from tritonforge.runtime.launcher.server import TritonLauncher
from tritonforge.runtime.supervisor.canaries import FAILED, OK, OVERLOADED, RECOVERING

if TYPE_CHECKING:
    from tritonforge.runtime.supervisor.supervisor import Supervisor


@dataclass
class Health:
    """Snapshot of the pipeline's health. ``models``: public model -> "ok", "overloaded: ...",
    "failed: ..." or "recovering: ..."; ``pipelines``: pipeline -> the worst of its models'
    states (just the word)."""

    healthy: bool = False
    models: dict[str, str] = field(default_factory=dict)
    pipelines: dict[str, str] = field(default_factory=dict)
    restarts: int = 0  # recoveries of any kind: model reloads + server restarts
    server_restarts: int = 0
    model_reloads: int = 0
    last_restart_reason: str = ""
    last_server_restart_reason: str = ""
    next_server_restart_in_s: float | None = None
    front: str = ""
    last_check_unix_s: float = 0.0
    building: dict[str, str] = field(default_factory=dict)
    """Exports still running in the background (label -> state), fed by :class:`BuildState`."""
    export_failures: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "status": "ok" if self.healthy else "unhealthy",
            "models": self.models,
            "pipelines": self.pipelines,
            "restarts": self.restarts,
            "server_restarts": self.server_restarts,
            "model_reloads": self.model_reloads,
            "last_restart_reason": self.last_restart_reason,
            "last_server_restart_reason": self.last_server_restart_reason,
            "next_server_restart_in_s": self.next_server_restart_in_s,
            "front": self.front,
            "last_check_unix_s": self.last_check_unix_s,
            "building": self.building,
            "export_failures": self.export_failures,
        }


class BuildState(Protocol):
    """What is still being exported (``runtime.cli.staged.BackgroundExports``)."""

    def building(self) -> dict[str, str]: ...

    def failed(self) -> dict[str, str]: ...


_SEVERITY = (OK, OVERLOADED, RECOVERING, FAILED)


def pipeline_states(models: Mapping[str, str], owner: Mapping[str, str]) -> dict[str, str]:
    """Pipeline -> the worst state word among its models' (ok < overloaded < recovering <
    failed)."""
    out: dict[str, str] = {}
    for model, state in models.items():
        word = state.split(":", 1)[0]
        word = word if word in _SEVERITY else FAILED
        pipeline = owner.get(model, model)
        if _SEVERITY.index(word) >= _SEVERITY.index(out.get(pipeline, OK)):
            out[pipeline] = word
    return out


class _QuietHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A reset or timed-out client connection is routine: no traceback on stderr."""
        exc = sys.exc_info()[1]
        if not isinstance(exc, (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


class HealthEndpoint:
    """``GET /health/pipeline`` -> 200 + JSON when the pipeline can serve, else 503.

    Healthy means: not draining, Triton ready and, when supervised, every public model answering
    its canary (every loaded one: with background exports, ``builds`` lists what is still being
    built and what failed, and nothing loaded yet is 503). Point load balancers here: unlike Triton's ``/v2/health/ready`` it flips the moment
    a shutdown starts and when a crashed stub leaves Triton "ready" but broken.
    """

    def __init__(
        self,
        server: TritonLauncher,
        host: str,
        port: int,
        supervisor: Supervisor | None = None,
        idle_timeout_s: float = 10.0,
    ) -> None:
        parent = self
        self.server = server
        self.supervisor = supervisor
        self.builds: BuildState | None = None
        self.draining = threading.Event()

        class Handler(BaseHTTPRequestHandler):
            timeout = idle_timeout_s  # an idle or slow connection may not hold a thread longer

            def do_GET(self) -> None:
                if self.path.rstrip("/") not in ("/health/pipeline", "/health"):
                    self.send_error(404, "try /health/pipeline")
                    return
                health = parent.health()
                body = json.dumps(health.to_json()).encode()
                self.send_response(200 if health.healthy else 503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.httpd = _QuietHTTPServer((host, port), Handler)
        self.url = f"http://{host}:{self.httpd.server_address[1]}/health/pipeline"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def health(self) -> Health:
        if self.supervisor is not None:
            health = self.supervisor.health()
        else:
            ready = self.server.is_ready(timeout_s=1.0)
            health = Health(
                healthy=ready, models={"tritonserver": "ready" if ready else "not ready"}
            )
        if self.builds is not None:
            health.building = self.builds.building()
            health.export_failures = self.builds.failed()
        if self.draining.is_set():
            health.healthy = False
            health.models = {m: "draining" for m in health.models} or {"tritonserver": "draining"}
        return health

    def start(self) -> HealthEndpoint:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self.httpd.shutdown()
        self.httpd.server_close()
