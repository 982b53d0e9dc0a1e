"""Pipeline-aware health and self-healing for the embedded server: liveness is not readiness.

Triton 2.51 never restarts a crashed Python stub and keeps answering ``/v2/health/ready`` with 200
(server#8604). The :class:`Supervisor` watches two things, on two threads:

- **liveness** (every ``poll_interval_s``): tritonserver's process and every stub PID. A dead
  stub gets its model reloaded (explicit model control) together with every model that calls it,
  transitively (ensembles through their steps, BLS models through their ``*_model(s)``
  parameters: :func:`model_calls`); the other models keep serving. Only when tritonserver itself
  exits is the whole server restarted, with exponential back-off and a cap (:class:`Backoff`).
- **readiness** (every ``canary_interval_s``): one canary inference through every public model,
  on its own connection straight to Triton's private socket (past the front's connection limit
  and queue). A canary refused or timed out because the server is busy (queue full,
  ``UNAVAILABLE``, deadline) is *overload*: the pipeline is reported not ready, nothing is
  restarted. A canary naming an unhealthy stub, or failing otherwise ``failures_to_reload``
  times in a row, reloads that model and its dependents (never the server).

``health()`` is what ``serve`` exposes on its pipeline health endpoint, with the reason of the
last recovery; every action is also logged.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tritonforge.errors import ModelConfigError
from tritonforge.modelconfig import ModelConfig
from tritonforge.pipelines import from_repository
from tritonforge.repository import load_model_config, model_names, referenced_models
from tritonforge.runtime.errors import EmbeddedServerError, ModelLoadError
from tritonforge.runtime.server import EmbeddedServer

log = logging.getLogger(__name__)

CANARY_TEXT = b"tritonforge canary"
OK = "ok"
OVERLOADED = "overloaded"
FAILED = "failed"
RECOVERING = "recovering"
# What Triton, the front and our models answer when they are busy, not broken.
_OVERLOAD_CODES = ("UNAVAILABLE", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED")
_OVERLOAD_WORDS = (
    "queue",
    "deadline",
    "timed out",
    "timeout",
    "too many",
    "busy",
    "overload",
    "no answer from tritonserver",
    "try again",
)
# ... but these UNAVAILABLE answers mean the model is gone, not busy.
_GONE_WORDS = ("unknown model", "no available versions", "not found", "is not ready")
_UNHEALTHY_STUB = re.compile(r"Stub process '([^']+)' is not healthy")


def _repository_configs(repository: Path) -> dict[str, ModelConfig]:
    configs: dict[str, ModelConfig] = {}
    for name in model_names(repository):
        with contextlib.suppress(ModelConfigError):
            configs[name] = load_model_config(repository, name)
    return configs


def model_calls(configs: Mapping[str, ModelConfig]) -> dict[str, set[str]]:
    """Model -> the models it calls: an ensemble's steps, a Python (BLS) model's declared
    ``*_model``/``*_models`` parameters (:func:`referenced_models`). Read from the configs only."""
    calls: dict[str, set[str]] = {}
    for name, cfg in configs.items():
        called: set[str] = set()
        if cfg.raw.get("platform") == "ensemble":
            steps = cfg.raw.get("ensemble_scheduling", {}).get("step", [])
            called |= {str(s.get("model_name", "")) for s in steps}
        called |= set(referenced_models(cfg.parameters).values())
        calls[name] = {m for m in called if m and m != name}
    return calls


def dependents(calls: Mapping[str, set[str]], models: Iterable[str]) -> set[str]:
    """Every model that calls one of ``models``, directly or through others (not ``models``)."""
    wanted = set(models)
    found: set[str] = set()
    frontier = set(wanted)
    while frontier:
        callers = {m for m, called in calls.items() if called & frontier} - found - wanted
        found |= callers
        frontier = callers
    return found


def reload_plan(calls: Mapping[str, set[str]], models: Iterable[str]) -> list[list[str]]:
    """Waves of models to reload after ``models`` broke: ``models`` first, then their
    dependents, each wave only calling models of earlier waves (a wave's loads are independent
    and may run together)."""
    first = sorted(set(models))
    todo = dependents(calls, first)
    done = set(first)
    waves = [first] if first else []
    while todo:
        wave = sorted(m for m in todo if not (calls.get(m, set()) & todo))
        if not wave:  # a cycle (the lint refuses them): load the rest together
            wave = sorted(todo)
        waves.append(wave)
        done |= set(wave)
        todo -= set(wave)
    return waves


def callees(calls: Mapping[str, set[str]], model: str) -> set[str]:
    """``model`` and every model it calls, transitively."""
    found = {model}
    frontier = {model}
    while frontier:
        frontier = {c for m in frontier for c in calls.get(m, set())} - found
        found |= frontier
    return found


def public_models(repository: Path) -> list[str]:
    """What the canaries call: every discovered pipeline's public models (ensembles, BLS; from
    the ``tritonforge.*`` parameters), plus any other model no other model calls (ensemble steps
    and declared BLS targets are internal)."""
    pipelines = from_repository(repository).values()
    members = {m for p in pipelines for m in p.models}
    configs = _repository_configs(repository)
    called = {m for targets in model_calls(configs).values() for m in targets}
    others = set(configs) - called - members
    return sorted(others | {m for p in pipelines for m in p.public_models if m in configs})


def pipeline_of(repository: Path, models: Iterable[str]) -> dict[str, str]:
    """Public model -> the pipeline it belongs to (its own name when it declares none)."""
    owner = {m: p.name for p in from_repository(repository).values() for m in p.public_models}
    return {m: owner.get(m, m) for m in models}


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


def classify_failure(error: str) -> str:
    """:data:`OVERLOADED` when a canary's error says the server is busy (queue full,
    ``UNAVAILABLE``, ``RESOURCE_EXHAUSTED``, a deadline), else :data:`FAILED`."""
    lowered = error.lower()
    if _UNHEALTHY_STUB.search(error) or any(w in lowered for w in _GONE_WORDS):
        return FAILED
    if any(code in error for code in _OVERLOAD_CODES) or any(w in lowered for w in _OVERLOAD_WORDS):
        return OVERLOADED
    return FAILED


def unhealthy_stubs(error: str) -> list[str]:
    """Model instances a canary's error reports unhealthy (``Stub process '<x>' is not
    healthy``)."""
    return sorted(set(_UNHEALTHY_STUB.findall(error)))


@dataclass
class Backoff:
    """Delays between whole-server restarts: none for the first, then ``base_s`` doubling up to
    ``cap_s``; a server that stayed up ``stable_s`` starts the series again."""

    base_s: float = 1.0
    cap_s: float = 30.0
    stable_s: float = 60.0
    attempts: int = 0
    last_start_s: float | None = None

    def next_delay_s(self, now_s: float) -> float:
        if self.last_start_s is not None and now_s - self.last_start_s >= self.stable_s:
            self.attempts = 0
        delay = (
            0.0 if self.attempts == 0 else min(self.cap_s, self.base_s * 2 ** (self.attempts - 1))
        )
        self.attempts += 1
        return delay

    def started(self, now_s: float) -> None:
        self.last_start_s = now_s


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
    """What is still being exported (``runtime.staged.BackgroundExports``)."""

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


def stream_canary(url: str, model: str, inputs: list[Any], timeout_s: float) -> None:
    """One request to a decoupled model over a gRPC stream (a unary infer is refused), asking
    for one token (``max_tokens``: the generate convention); raises unless it ends with a final
    response within ``timeout_s`` (TimeoutError: no answer in time)."""
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
            try:
                result, error = responses.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"deadline: no final response within {timeout_s:g} s") from None
            if error is not None:
                raise error
            final = result.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                return
    finally:
        stop_stream(client)
        client.close()


def stop_stream(client: Any) -> None:
    """``client.stop_stream(cancel_requests=True)`` without its thread leak: tritonclient then
    never ends the request iterator, so the thread gRPC feeds the stream from blocks forever
    (measured: one thread per canary; the 10-min chaos process reached 4,900 threads)."""
    stream = getattr(client, "_stream", None)
    try:
        client.stop_stream(cancel_requests=True)
    finally:
        queued = getattr(stream, "_request_queue", None)
        if queued is not None:
            queued.put(None)  # the end of the request stream


def _error_text(e: BaseException) -> str:
    status = getattr(e, "status", None)
    code = status() if callable(status) else ""
    return f"{type(e).__name__}: {code + ' ' if code else ''}{e}"[:300]


class Supervisor:
    """Watches an :class:`EmbeddedServer`: reloads what died, reports what is busy, restarts the
    server only when tritonserver exits (see the module docstring)."""

    def __init__(
        self,
        server: EmbeddedServer,
        models: Sequence[str] | None = None,
        canary_interval_s: float = 5.0,
        canary_timeout_s: float = 10.0,
        poll_interval_s: float = 0.5,
        failures_to_reload: int = 2,
        on_restart: Callable[[str], None] | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        repo = Path(server.settings.model_repository)
        self.server = server
        self.models = list(models) if models is not None else public_models(repo)
        all_configs = _repository_configs(repo)
        self.calls = model_calls(all_configs)
        self.configs = {m: all_configs.get(m) or load_model_config(repo, m) for m in self.models}
        self.owner = pipeline_of(repo, self.models)
        self.canary_interval_s = canary_interval_s
        self.canary_timeout_s = canary_timeout_s
        self.poll_interval_s = poll_interval_s
        self.failures_to_reload = failures_to_reload
        self.on_restart = on_restart
        self.backoff = backoff or Backoff()
        self._health = Health()
        self._lock = threading.Lock()
        self._action = threading.Lock()  # one recovery at a time; canaries skip meanwhile
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._stubs: dict[str, int] = {}
        self._stub_models: dict[str, str] = {}
        self._failures: dict[str, int] = {}
        # (models, reason, whether a stub is sick: its decoupled streams never end)
        self._reload_requests: queue.Queue[tuple[frozenset[str], str, bool]] = queue.Queue()

    # -- checks ------------------------------------------------------------------------------
    def canary(self, models: Iterable[str] | None = None) -> dict[str, str]:
        """Model -> "ok", "overloaded: <error>" or "failed: <error>" of one inference through
        it (every public model, or only ``models``), on a connection of its own to Triton's
        private socket (bounded in time)."""
        import tritonclient.grpc as grpcclient

        wanted = None if models is None else set(models)

        url = self.server.direct_grpc_url
        results: dict[str, str] = {}
        client = grpcclient.InferenceServerClient(url)
        try:
            for name, cfg in self.configs.items():
                if wanted is not None and name not in wanted:
                    continue
                inputs = []
                for input_name, value in canary_inputs(cfg).items():
                    tensor = grpcclient.InferInput(
                        input_name, list(value.shape), cfg.input(input_name).wire_dtype
                    )
                    tensor.set_data_from_numpy(value)
                    inputs.append(tensor)
                try:
                    if cfg.raw.get("model_transaction_policy", {}).get("decoupled"):
                        stream_canary(url, name, inputs, self.canary_timeout_s)
                    else:
                        client.infer(name, inputs, client_timeout=self.canary_timeout_s)
                    results[name] = OK
                except Exception as e:  # any failure is a failed canary; which kind, below
                    text = _error_text(e)
                    results[name] = f"{classify_failure(text)}: {text}"
        finally:
            client.close()
        return results

    def check_front(self) -> str:
        """ "ok" when the front's gRPC reaches Triton; else refresh its upstream (a channel
        stuck in reconnect back-off answers "not reachable" while Triton is up) and say so."""
        if not self.server.settings.front:
            return ""
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(self.server.grpc_url)
        try:
            client.is_server_live(client_timeout=self.canary_timeout_s)
            return OK
        except Exception as e:  # the front answered, but not Triton's answer
            text = _error_text(e)
            if "not reachable" not in text and "connect" not in text.lower():
                return f"{classify_failure(text)}: {text}"
            self.server.refresh_front()
            log.warning("supervisor: the front could not reach tritonserver (%s); refreshed", text)
            return f"refreshed: {text}"
        finally:
            client.close()

    def dead_stubs(self) -> list[str]:
        """Model instances whose stub process disappeared since the last (re)start."""
        alive = self.server.stub_pids()
        return sorted(name for name, pid in self._stubs.items() if alive.get(name) != pid)

    def health(self) -> Health:
        with self._lock:
            snapshot = Health(**vars(self._health))
            snapshot.models = dict(snapshot.models)
            snapshot.pipelines = dict(snapshot.pipelines)
            return snapshot

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
    def _snapshot_stubs(self, models: Iterable[str] | None = None) -> None:
        """Remember the stub PIDs: all of them, or only those of ``models`` (just reloaded): a
        stub of another model that died meanwhile must still be seen missing."""
        stubs = self.server.stubs()
        if models is None:
            self._stubs = {name: pid for name, (pid, _) in stubs.items()}
            self._stub_models = {name: model for name, (_, model) in stubs.items()}
            return
        fresh = set(models)
        kept = {i: m for i, m in self._stub_models.items() if m not in fresh}
        self._stubs = {i: pid for i, pid in self._stubs.items() if i in kept}
        self._stub_models = kept
        for name, (pid, model) in stubs.items():
            if model in fresh:
                self._stubs[name] = pid
                self._stub_models[name] = model

    def start(self) -> Supervisor:
        self._snapshot_stubs()
        self.backoff.started(time.monotonic())
        self._record(self.canary())
        self._threads = [
            threading.Thread(target=self._watch, name="supervisor-liveness", daemon=True),
            threading.Thread(target=self._probe, name="supervisor-readiness", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def _record(
        self, results: dict[str, str], front: str | None = None, partial: bool = False
    ) -> bool:
        """Record a canary round (``partial``: of some models only, merged into the rest)."""
        with self._lock:
            if partial:
                results = {**self._health.models, **results}
            healthy = bool(results) and all(v == OK for v in results.values())
            self._health.models = results
            self._health.pipelines = pipeline_states(results, self.owner)
            self._health.healthy = healthy
            self._health.last_check_unix_s = time.time()
            if front is not None:
                self._health.front = front
        return healthy

    def _mark(self, models: Iterable[str], state: str) -> None:
        with self._lock:
            for model in models:
                if model in self._health.models or model in self.models:
                    self._health.models[model] = state
            self._health.pipelines = pipeline_states(self._health.models, self.owner)
            self._health.healthy = False

    def _server_down(self) -> bool:
        return self.server.pid is None or self.server.returncode is not None

    def _watch(self) -> None:
        """Liveness: tritonserver's exit restarts it (backed off); a dead stub reloads its model
        and dependents; reloads the readiness thread asked for."""
        while not self._stop.wait(self.poll_interval_s):
            try:
                self._watch_once()
            except Exception:  # the watcher must survive anything; say what happened
                log.exception("supervisor: liveness check failed")

    def _watch_once(self) -> None:
        if self._server_down():
            code = self.server.returncode
            self._restart_server(f"tritonserver exited with status {code}")
            return
        dead = self.dead_stubs()
        if dead:
            models = {self._stub_models[i] for i in dead if i in self._stub_models}
            self._recover(models, f"stub process of {', '.join(dead)} died", dead)
            return
        asked, reasons, sick = self._pending_reloads()
        if asked:
            self._recover(asked, "; ".join(reasons), (), sick=sick)

    def _pending_reloads(self) -> tuple[set[str], list[str], bool]:
        """Every reload the readiness thread asked for so far, together (several canaries may
        report the same broken stub), and whether one named an unhealthy stub."""
        models: set[str] = set()
        reasons: list[str] = []
        sick = False
        with contextlib.suppress(queue.Empty):
            while True:
                asked, reason, stub_sick = self._reload_requests.get_nowait()
                models |= asked
                reasons.append(reason)
                sick = sick or stub_sick
        return models, reasons, sick

    def _probe(self) -> None:
        """Readiness: canaries every ``canary_interval_s``; overload only marks not ready."""
        next_canary = time.monotonic() + self.canary_interval_s
        while not self._stop.wait(min(self.poll_interval_s, self.canary_interval_s)):
            if time.monotonic() < next_canary:
                continue
            next_canary = time.monotonic() + self.canary_interval_s
            if not self.configs:  # nothing loaded yet (a staged start): no canary can fail
                continue
            if self._action.locked() or self._server_down():
                continue  # a recovery is under way: it records its own canary
            try:
                self._probe_once()
            except Exception:
                log.exception("supervisor: canary round failed")

    def _probe_once(self) -> None:
        results = self.canary()
        if self._action.locked():
            return  # broke because a recovery started meanwhile
        front = self.check_front()
        self._record(results, front)
        for model, state in results.items():
            if state == OK or state.startswith(OVERLOADED):
                self._failures[model] = 0
                continue
            self._failures[model] = self._failures.get(model, 0) + 1
            stubs = unhealthy_stubs(state)
            broken = {self._stub_models.get(i, i.rsplit("_", 2)[0]) for i in stubs}
            if broken:  # the stub reports unhealthy: reload it and what calls it, now
                self._reload_requests.put((frozenset(broken), f"{model}: {state}", True))
                self._failures[model] = 0
            elif self._failures[model] >= self.failures_to_reload:
                # broken, and not busy: reload the model and every model it calls
                targets = frozenset(callees(self.calls, model))
                why = f"canary failed {self._failures[model]}x for {model}: {state}"
                self._reload_requests.put((targets, why, False))
                self._failures[model] = 0

    # -- recoveries ----------------------------------------------------------------------------
    def _notify(self, reason: str) -> None:
        """Log the recovery (through ``on_restart`` when given: ``serve`` logs it itself)."""
        if self.on_restart is None:
            log.warning("supervisor: recovering (%s)", reason)
        else:
            self.on_restart(reason)

    def _recover(
        self, models: set[str], reason: str, dead: Sequence[str], sick: bool = False
    ) -> None:
        """Reload ``models``, then every model that calls them and still does not answer
        (explicit control); with another control mode a dead stub can only be revived by
        restarting the server.

        Triton reloads an ensemble itself when one of its steps is loaded, and a BLS model calls
        its targets by name, so after the broken model's reload most dependents answer at once;
        a canary through each one that calls it decides which dependents need a reload of their
        own (each reload costs CPU and, for a Python model, a new stub)."""
        if self.server.settings.model_control_mode != "explicit":
            self._restart_server(reason)
            return
        with self._action:
            first, *later = reload_plan(self.calls, models)
            affected = [m for m in self.models if callees(self.calls, m) & models]
            self._mark(affected, f"{RECOVERING}: {reason}")
            self._notify(f"{reason}; reloading {', '.join(first)}")
            reloaded: list[str] = []
            error = ""
            started = time.monotonic()
            orphaned = {*models, *affected}
            ended = f"{', '.join(sorted(models))} is unavailable: its stub crashed and is reloading; retry"
            if dead or sick:  # a dead stub never ends the streams it held: end them, saying why
                self._end_streams(orphaned, ended)
            try:
                for model in first:
                    self._load(model)
                    reloaded.append(model)
                results = self.canary(affected)  # only those: a full round took minutes under load
                still = [m for m in affected if results.get(m, OK) != OK]
                broken = {m for m in still if not results[m].startswith(OVERLOADED)}
                wanted = {c for m in broken for c in callees(self.calls, m)}
                for model in [m for wave in later for m in wave if m in wanted]:
                    self._load(model)  # one at a time: Triton reloads ensembles itself too
                    reloaded.append(model)
            except (EmbeddedServerError, OSError) as e:
                error = f"; reload failed: {e}"[:500]
                log.error("supervisor: %s%s", reason, error)
            if dead or sick:  # Triton kept routing to the dead instance until the new one was in
                self._end_streams(orphaned, ended, opened_before_s=time.monotonic())
            self._snapshot_stubs(reloaded or first)
            self._pending_reloads()  # asked before this reload: stale now
            with self._lock:
                self._health.restarts += 1
                self._health.model_reloads += 1
                self._health.last_restart_reason = (
                    f"{reason}; reloaded {', '.join(reloaded)} in "
                    f"{time.monotonic() - started:.1f} s{error}"
                )
            self._record(self.canary(affected), partial=True)

    def _end_streams(
        self, models: Iterable[str], reason: str, opened_before_s: float | None = None
    ) -> None:
        count = self.server.end_streams(models, reason, opened_before_s)
        if count:
            log.warning("supervisor: ended %d open streams (%s)", count, reason)

    def _load(self, model: str) -> None:
        """Reload ``model`` (a fresh instance); a load that Triton superseded with its own (it
        reloads an ensemble when a step model is loaded) is done."""
        try:
            self.server.load_model(model, force=True)
        except ModelLoadError as e:
            if "Newer operation has been applied" not in str(e.failures):
                raise

    def _restart_server(self, reason: str) -> None:
        """Restart tritonserver on the same ports, after the back-off's delay (interruptible)."""
        with self._action:
            delay_s = self.backoff.next_delay_s(time.monotonic())
            self._mark(self.models, f"{RECOVERING}: {reason}")
            with self._lock:
                self._health.last_server_restart_reason = reason
                self._health.next_server_restart_in_s = delay_s
            if delay_s:
                log.warning("supervisor: %s; restarting the server in %.1f s", reason, delay_s)
            if self._stop.wait(delay_s):
                return
            self._notify(f"{reason}; restarting tritonserver")
            try:
                self.server.restart()
            except EmbeddedServerError as e:
                log.error("supervisor: restart failed: %s", str(e).splitlines()[0])
                with self._lock:
                    self._health.last_restart_reason = f"{reason}; restart failed: {e}"[:500]
                    self._health.last_server_restart_reason = self._health.last_restart_reason
                return
            finally:
                with self._lock:
                    self._health.next_server_restart_in_s = None
            self.backoff.started(time.monotonic())
            self._snapshot_stubs()
            with self._lock:
                self._health.restarts += 1
                self._health.server_restarts += 1
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
