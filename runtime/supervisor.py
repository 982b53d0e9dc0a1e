"""Pipeline-aware health and self-healing for the embedded server.

Triton 2.51 never restarts a crashed Python stub and keeps answering ``/v2/health/ready`` with 200
(server#8604). The :class:`Supervisor` therefore watches what matters: the stub processes (cheap,
every ``poll_interval_s``) and a canary inference through every public model (every
``canary_interval_s``). When a stub vanishes or canaries fail ``failures_to_restart`` times in a
row, it recovers: with explicit model control it reloads just the broken model (the others keep
serving), otherwise it restarts the server on the same ports. ``health()`` is what
``serve`` exposes on its pipeline health endpoint.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tritonforge.errors import ModelConfigError
from tritonforge.modelconfig import ModelConfig
from tritonforge.pipelines import from_repository
from tritonforge.repository import load_model_config, model_names, referenced_models
from tritonforge.runtime.errors import ServerError
from tritonforge.runtime.server import EmbeddedServer

CANARY_TEXT = b"tritonforge canary"


def public_models(repository: Path) -> list[str]:
    """What the canaries call: every discovered pipeline's public models (ensembles, BLS; from
    the ``tritonforge.*`` parameters), plus any other model no other model calls (ensemble steps
    and declared BLS targets are internal)."""
    pipelines = from_repository(repository).values()
    members = {m for p in pipelines for m in p.models}
    configs: dict[str, ModelConfig] = {}
    for name in model_names(repository):
        with contextlib.suppress(ModelConfigError):
            configs[name] = load_model_config(repository, name)
    called: set[str] = set()
    for cfg in configs.values():
        if cfg.raw.get("platform") == "ensemble":
            steps = cfg.raw.get("ensemble_scheduling", {}).get("step", [])
            called |= {str(s.get("model_name", "")) for s in steps}
        called |= set(referenced_models(cfg.parameters).values())
    others = set(configs) - called - members
    return sorted(others | {m for p in pipelines for m in p.public_models if m in configs})


def canary_inputs(config: ModelConfig) -> dict[str, np.ndarray]:
    """One-row sample for every required input: a short text for BYTES, ones otherwise."""
    inputs: dict[str, np.ndarray] = {}
    for spec in config.inputs:
        if spec.optional:
            continue
        shape = tuple(1 if d < 0 else d for d in spec.full_shape(config.batched))
        if np.dtype(spec.numpy_dtype).kind == "O":
            inputs[spec.name] = np.full(shape, CANARY_TEXT, dtype=np.object_)
        else:
            inputs[spec.name] = np.ones(shape, dtype=spec.numpy_dtype)
    return inputs


@dataclass
class Health:
    """Snapshot of the pipeline's health."""

    healthy: bool = False
    models: dict[str, str] = field(default_factory=dict)
    restarts: int = 0
    last_restart_reason: str = ""
    last_check_unix_s: float = 0.0
    building: dict[str, str] = field(default_factory=dict)
    """Exports still running in the background (label -> state), fed by :class:`BuildState`."""
    export_failures: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "status": "ok" if self.healthy else "unhealthy",
            "models": self.models,
            "restarts": self.restarts,
            "last_restart_reason": self.last_restart_reason,
            "last_check_unix_s": self.last_check_unix_s,
            "building": self.building,
            "export_failures": self.export_failures,
        }


class BuildState(Protocol):
    """What is still being exported (``runtime.staged.BackgroundExports``)."""

    def building(self) -> dict[str, str]: ...

    def failed(self) -> dict[str, str]: ...


def stream_canary(url: str, model: str, inputs: list[Any], timeout_s: float) -> None:
    """One request to a decoupled model over a gRPC stream (a unary infer is refused), asking
    for one token (``max_tokens``: the generate convention); raises unless it ends with a final
    response within ``timeout_s``."""
    import queue

    import tritonclient.grpc as grpcclient

    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        client.async_stream_infer(
            model, inputs, parameters={"max_tokens": 1}, enable_empty_final_response=True
        )
        deadline = time.monotonic() + timeout_s
        while True:
            result, error = responses.get(timeout=max(0.01, deadline - time.monotonic()))
            if error is not None:
                raise error
            final = result.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                return
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


class Supervisor:
    """Watches an :class:`EmbeddedServer` and restarts it when the pipeline stops answering."""

    def __init__(
        self,
        server: EmbeddedServer,
        models: Sequence[str] | None = None,
        canary_interval_s: float = 5.0,
        canary_timeout_s: float = 10.0,
        poll_interval_s: float = 0.5,
        failures_to_restart: int = 2,
        on_restart: Callable[[str], None] | None = None,
    ) -> None:
        repo = Path(server.settings.model_repository)
        self.server = server
        self.models = list(models) if models is not None else public_models(repo)
        self.configs = {m: load_model_config(repo, m) for m in self.models}
        self.canary_interval_s = canary_interval_s
        self.canary_timeout_s = canary_timeout_s
        self.poll_interval_s = poll_interval_s
        self.failures_to_restart = failures_to_restart
        self.on_restart = on_restart
        self._health = Health()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stubs: dict[str, int] = {}
        self._stub_models: dict[str, str] = {}

    # -- checks ------------------------------------------------------------------------------
    def canary(self) -> dict[str, str]:
        """Model -> "ok" or the error of one inference through it (gRPC, bounded in time)."""
        import tritonclient.grpc as grpcclient

        results: dict[str, str] = {}
        client = grpcclient.InferenceServerClient(self.server.grpc_url)
        try:
            for name, cfg in self.configs.items():
                inputs = []
                for input_name, value in canary_inputs(cfg).items():
                    tensor = grpcclient.InferInput(
                        input_name, list(value.shape), cfg.input(input_name).wire_dtype
                    )
                    tensor.set_data_from_numpy(value)
                    inputs.append(tensor)
                try:
                    if cfg.raw.get("model_transaction_policy", {}).get("decoupled"):
                        stream_canary(self.server.grpc_url, name, inputs, self.canary_timeout_s)
                    else:
                        client.infer(name, inputs, client_timeout=self.canary_timeout_s)
                    results[name] = "ok"
                except Exception as e:  # any failure is a failed canary
                    results[name] = f"{type(e).__name__}: {e}"[:300]
        finally:
            client.close()
        return results

    def dead_stubs(self) -> list[str]:
        """Model instances whose stub process disappeared since the last (re)start."""
        alive = self.server.stub_pids()
        return sorted(name for name, pid in self._stubs.items() if alive.get(name) != pid)

    def health(self) -> Health:
        with self._lock:
            return Health(**vars(self._health))

    def add_models(self, models: Sequence[str]) -> None:
        """Also watch ``models`` (just loaded, e.g. by a background export): their stubs and
        canaries; one canary round runs at once."""
        repo = Path(self.server.settings.model_repository)
        new = [m for m in models if m not in self.configs]
        # rebound, not mutated: the supervisor thread may be iterating the old ones
        self.configs = {**self.configs, **{m: load_model_config(repo, m) for m in new}}
        self.models = [*self.models, *new]
        self._snapshot_stubs()
        self._record(self.canary())

    # -- loop --------------------------------------------------------------------------------
    def _snapshot_stubs(self) -> None:
        stubs = self.server.stubs()
        self._stubs = {name: pid for name, (pid, _) in stubs.items()}
        self._stub_models = {name: model for name, (_, model) in stubs.items()}

    def start(self) -> Supervisor:
        self._snapshot_stubs()
        self._record(self.canary())
        self._thread = threading.Thread(target=self._run, name="supervisor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _record(self, results: dict[str, str]) -> bool:
        healthy = bool(results) and all(v == "ok" for v in results.values())
        with self._lock:
            self._health.models = results
            self._health.healthy = healthy
            self._health.last_check_unix_s = time.time()
        return healthy

    def _run(self) -> None:
        failures = 0
        next_canary = time.monotonic() + self.canary_interval_s
        while not self._stop.wait(self.poll_interval_s):
            code = self.server.returncode
            if code is not None:  # any death: kill -9/-11/-6, an abort inside Triton
                self._restart(f"tritonserver exited with status {code}")
                failures = 0
                next_canary = time.monotonic() + self.canary_interval_s
                continue
            dead = self.dead_stubs()
            if dead:
                self._restart(f"stub process of {', '.join(dead)} died", dead)
                failures = 0
                next_canary = time.monotonic() + self.canary_interval_s
                continue
            if time.monotonic() < next_canary:
                continue
            next_canary = time.monotonic() + self.canary_interval_s
            if not self.configs:  # nothing loaded yet (a staged start): no canary can fail
                continue
            failures = 0 if self._record(self.canary()) else failures + 1
            if failures >= self.failures_to_restart:
                bad = [m for m, v in self.health().models.items() if v != "ok"]
                self._restart(f"canary failed {failures}x for {', '.join(bad)}")
                failures = 0

    def _reload(self, dead: Sequence[str]) -> bool:
        """With explicit model control, reload only the models whose stubs died (the others keep
        serving); False when that is not possible or fails."""
        if self.server.settings.model_control_mode != "explicit" or not dead:
            return False
        models = sorted({self._stub_models[i] for i in dead if i in self._stub_models})
        try:
            for model in models:
                self.server.load_model(model, force=True)
        except (ServerError, OSError):
            return False
        return True

    def _restart(self, reason: str, dead: Sequence[str] = ()) -> None:
        with self._lock:
            self._health.healthy = False
            self._health.models = {m: f"recovering: {reason}" for m in self.models}
        if self.on_restart is not None:
            self.on_restart(reason)
        try:
            if self._reload(dead):
                self._snapshot_stubs()
                with self._lock:
                    self._health.restarts += 1
                    self._health.last_restart_reason = f"{reason}; reloaded the model"
                self._record(self.canary())
                return
            self.server.restart()
        except ServerError as e:
            with self._lock:
                self._health.last_restart_reason = f"{reason}; restart failed: {e}"
            return
        self._snapshot_stubs()
        with self._lock:
            self._health.restarts += 1
            self._health.last_restart_reason = reason
        self._record(self.canary())


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
        server: EmbeddedServer,
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
