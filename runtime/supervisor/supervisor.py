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
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tritonforge.repository import load_model_config
from tritonforge.runtime.errors import EmbeddedServerError, ModelLoadError
from tritonforge.runtime.launcher.planned_loads import StubExits
from tritonforge.runtime.launcher.server import TritonLauncher
from tritonforge.runtime.supervisor.canaries import (
    OK,
    OVERLOADED,
    RECOVERING,
    canary_round,
    classify_failure,
    error_text,
    unhealthy_stubs,
)
from tritonforge.runtime.supervisor.health import (
    Health,
    pipeline_states,
)
from tritonforge.runtime.supervisor.model_graph import (
    callees,
    model_calls,
    pipeline_of,
    public_models,
    reload_plan,
    repository_configs,
)

log = logging.getLogger(__name__)
# A model's reload (a fresh instance: generate's ONNX session and warm-up) may take this long;
# 10-18 s measured for generate on a shared 2-core host at load 12 (the fresh-clone run, 2026-12-04).
RELOAD_TIMEOUT_S = 120.0


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


class Supervisor:
    """Watches an :class:`TritonLauncher`: reloads what died, reports what is busy, restarts the
    server only when tritonserver exits (see the module docstring)."""

    def __init__(
        self,
        server: TritonLauncher,
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
        all_configs = repository_configs(repo)
        self.calls = model_calls(all_configs)
        ensembles = [m for m, c in all_configs.items() if c.raw.get("platform") == "ensemble"]
        self._exits = StubExits(server.planned, self.calls, ensembles)  # planned loads' stubs
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
    def canary(
        self, models: Iterable[str] | None = None, concurrent: bool = False
    ) -> dict[str, str]:
        """Model -> "ok", "overloaded: <error>" or "failed: <error>" of one inference through
        it (every public model, or only ``models``; all at once with ``concurrent``), each on a
        connection of its own to Triton's private socket (bounded in time)."""
        return canary_round(
            self.server.direct_grpc_url,
            self.configs,
            self.canary_timeout_s,
            models,
            concurrent,
            self._stop,
        )

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
            text = error_text(e)
            if "not reachable" not in text and "connect" not in text.lower():
                return f"{classify_failure(text)}: {text}"
            self.server.refresh_front()
            log.warning("supervisor: the front could not reach tritonserver (%s); refreshed", text)
            return f"refreshed: {text}"
        finally:
            client.close()

    def dead_stubs(self) -> list[str]:
        """Model instances whose stub process disappeared since the last (re)start, not counting
        those a planned load (:class:`PlannedLoads`: a staged load, a reload) retired: the stubs
        of models whose planned loads finished are snapshotted afresh first."""
        settled = self._exits.settled(set(self._stub_models.values()))
        if settled:
            self._snapshot_stubs(settled)
        alive = self.server.stub_pids()
        return sorted(
            name
            for name, pid in self._stubs.items()
            if alive.get(name) != pid
            and not self._exits.planned_exit(self._stub_models.get(name, name))
        )

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
        # generations first: a load finishing after the PIDs are read is seen as new
        everything = {*self.calls, *self._stub_models.values()}
        self._exits.record(everything if models is None else set(models))
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
        if self._action.locked() or self._stop.is_set():
            return  # broke because a recovery started meanwhile, or stopping (a shutdown)
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
            results: dict[str, str] = {}
            try:
                for model in first:
                    self._load(model)
                    reloaded.append(model)
                # only the affected models (a full round took minutes under load), all at once
                results = self.canary(affected, concurrent=True)
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
            # what answered and calls nothing reloaded since is recorded as it is; the rest is
            # asked again
            since = set(reloaded[len(first) :])
            again = [m for m in affected if results.get(m) != OK or callees(self.calls, m) & since]
            results = {m: v for m, v in results.items() if v == OK}
            if again:
                results.update(self.canary(again, concurrent=True))
            self._record(results, partial=True)

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
            self.server.load_model(model, timeout_s=RELOAD_TIMEOUT_S, force=True)
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
