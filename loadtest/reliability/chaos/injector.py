"""The chaos run itself: fixed-rate traffic through every public model while a seeded injector
kills stubs, floods, opens and cancels streams and sends malformed headers."""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tritonforge.loadtest.reliability.chaos import outcomes
from tritonforge.loadtest.reliability.chaos.outcomes import (
    ChaosReport,
    Kill,
    Outcome,
    PipelineReport,
    back_after_s,
)
from tritonforge.loadtest.reliability.chaos.probes import (
    MALFORMED,
    Target,
    malformed_once,
    sse_once,
    stream_once,
    targets,
    text_tensor,
)
from tritonforge.pipelines import from_repository
from tritonforge.runtime.launcher.settings import ServerSettings
from tritonforge.runtime.serving import EmbeddedServer
from tritonforge.runtime.supervisor.canaries import OVERLOADED, classify_failure
from tritonforge.runtime.supervisor.model_graph import callees
from tritonforge.runtime.supervisor.supervisor import Supervisor

log = logging.getLogger(__name__)


class Chaos:
    """Traffic at a fixed rate plus the fault injector, against a supervised server."""

    def __init__(
        self,
        server: EmbeddedServer,
        supervisor: Supervisor,
        rate_per_s: float,
        timeout_s: float,
        seed: int,
        faults: Sequence[str],
        fault_interval_s: float,
        flood_extra: int = 16,
        sse_streams: int = 64,
        cooldown_s: float = 15.0,
    ) -> None:
        self.server, self.supervisor = server, supervisor
        self.repository = Path(server.settings.model_repository)
        self.targets = targets(self.repository, supervisor.models)
        self.pipelines = from_repository(self.repository)
        self.rate_per_s, self.timeout_s = rate_per_s, timeout_s
        self.random = random.Random(seed)
        self.fault_names = list(faults)
        self.fault_interval_s = fault_interval_s
        self.flood_extra, self.sse_streams = flood_extra, sse_streams
        self.cooldown_s = cooldown_s  # no fault in the last seconds: each recovery is measured
        self.outcomes: list[Outcome] = []
        self.kills: list[Kill] = []
        self.fault_counts: dict[str, dict[str, int]] = {}
        self.flooded: set[str] = set()  # every pipeline flooded at some point (no ratio gate)
        # pipeline -> [start, end] of each flood (end: inf while it lasts)
        self.floods: dict[str, list[list[float]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=48)
        self._local = threading.local()
        self._faults: list[tuple[str, threading.Thread]] = []
        self._inflight: dict[int, tuple[Target, float]] = {}  # traffic not answered yet
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- traffic -------------------------------------------------------------------------------
    def _clients(self) -> tuple[Any, Any]:
        if not hasattr(self._local, "grpc"):
            import tritonclient.grpc as grpcclient
            import tritonclient.http as httpclient

            self._local.grpc = grpcclient.InferenceServerClient(self.server.grpc_url)
            self._local.http = httpclient.InferenceServerClient(
                self.server.http_url, network_timeout=self.timeout_s, connection_timeout=5.0
            )
        return self._local.grpc, self._local.http

    def _request(self, target: Target, n: int) -> None:
        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient

        started = self.now()
        with self._lock:
            self._inflight[n] = (target, started)
        text = f"chaos request {n}: the quick brown fox"
        kind, error = outcomes.OK, ""
        if target.decoupled:
            tensor = text_tensor(grpcclient, target.input, text, batched=False)
            kind, error = stream_once(
                self.server.grpc_url, target.model, [tensor], 2, self.timeout_s
            )
        else:
            grpc_client, http_client = self._clients()
            try:
                if n % 2:
                    tensors = target.tensors(grpcclient, text)
                    grpc_client.infer(target.model, tensors, client_timeout=self.timeout_s)
                else:
                    http_client.infer(target.model, target.tensors(httpclient, text))
            except Exception as e:  # every failure is classified below
                status = getattr(e, "status", lambda: None)()
                error = f"{type(e).__name__}: {status or ''} {e}"[:300]
                kind = outcomes.outcome_kind(error)
                if kind in (
                    outcomes.HUNG,
                    outcomes.LOST,
                ):  # a fresh connection for the next request
                    for client in self._clients():
                        with contextlib.suppress(Exception):
                            client.close()
                    del self._local.grpc
        if (
            kind == outcomes.CLEAN
            and classify_failure(error) == OVERLOADED
            and self.flooded_during(target.pipeline, started, self.now())
        ):
            kind = outcomes.SHED
        with self._lock:
            if self._inflight.pop(n, None) is None:
                return  # already reported hung: the run ended without it
            self.outcomes.append(
                Outcome(target.pipeline, target.model, started, self.now(), kind, error)
            )

    def _traffic(self, duration_s: float) -> None:
        period_s = 1.0 / self.rate_per_s
        n = 0
        next_s = time.monotonic()
        while not self._stop.is_set() and self.now() < duration_s:
            target = self.targets[n % len(self.targets)]
            self._pool.submit(self._request, target, n)
            n += 1
            next_s += period_s
            self._stop.wait(max(0.0, next_s - time.monotonic()))

    def flooded_during(self, pipeline: str, start_s: float, end_s: float) -> bool:
        """Whether a flood of ``pipeline`` overlapped [start_s, end_s] (a request queued during
        a flood and refused just after it is the flood's refusal)."""
        with self._lock:
            return any(s <= end_s and start_s <= e for s, e in self.floods.get(pipeline, []))

    @contextlib.contextmanager
    def _flooding(self, pipeline: str) -> Iterator[None]:
        window = [self.now(), float("inf")]
        with self._lock:
            self.floods.setdefault(pipeline, []).append(window)
            self.flooded.add(pipeline)
        try:
            yield
        finally:
            with self._lock:
                window[1] = self.now()

    # -- faults --------------------------------------------------------------------------------
    def _count(self, fault: str, kind: str) -> None:
        with self._lock:
            counts = self.fault_counts.setdefault(fault, {})
            counts[kind] = counts.get(kind, 0) + 1

    def _run_all(self, fault: str, calls: Sequence[Callable[[], tuple[str, str]]]) -> None:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(calls))) as pool:
            for future in [pool.submit(c) for c in calls]:
                kind, error = future.result()
                self._count(fault, kind)
                if kind in (outcomes.LOST, outcomes.HUNG):
                    log.warning("chaos: %s: %s %s", fault, kind, error)

    def _decoupled(self) -> list[Target]:
        return [t for t in self.targets if t.decoupled]

    def sigsegv(self) -> None:
        stubs = self.server.stubs()
        if not stubs:
            return
        instance = self.random.choice(sorted(stubs))
        pid, model = stubs[instance]
        public = [t.model for t in self.targets if model in callees(self.supervisor.calls, t.model)]
        pipelines = sorted({t.pipeline for t in self.targets if t.model in public})
        kill = Kill(self.now(), instance, model, pipelines, public)
        log.info("chaos: SIGSEGV %s (pid %d; pipelines %s)", instance, pid, pipelines)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSEGV)
        with self._lock:
            self.kills.append(kill)
        self._count("sigsegv", outcomes.OK)

    def flood(self) -> None:
        import tritonclient.grpc as grpcclient

        for target in self._decoupled():
            params = target.config.parameters
            size = int(params.get("max_running", 8)) + int(params.get("max_queue", 32))
            size += self.flood_extra
            log.info("chaos: flooding %s with %d streams", target.model, size)
            tensor = text_tensor(grpcclient, target.input, "flood: tell me a story", batched=False)
            with self._flooding(target.pipeline):
                self._run_all(
                    "flood",
                    [
                        functools.partial(
                            stream_once,
                            self.server.grpc_url,
                            target.model,
                            [tensor],
                            4,
                            self.timeout_s * 3,
                        )
                    ]
                    * size,
                )

    def sse(self, cancel: bool = False) -> None:
        for target in self._decoupled():
            body = {target.input: "sse: say hello", "parameters": {"max_tokens": 4}}
            log.info("chaos: %d SSE streams to %s%s", self.sse_streams, target.model,
                     " (dropped after the first event)" if cancel else "")  # fmt: skip
            with self._flooding(target.pipeline):
                self._run_all(
                    "sse_cancel" if cancel else "sse",
                    [
                        functools.partial(
                            sse_once,
                            self.server.http_url,
                            target.model,
                            body,
                            self.timeout_s * 3,
                            cancel,
                        )
                    ]
                    * self.sse_streams,
                )

    def cancel(self) -> None:
        import tritonclient.grpc as grpcclient

        for target in self._decoupled():
            tensor = text_tensor(grpcclient, target.input, "cancel: count to fifty", batched=False)
            self._run_all(
                "cancel",
                [
                    functools.partial(
                        stream_once,
                        self.server.grpc_url,
                        target.model,
                        [tensor],
                        64,
                        self.timeout_s,
                        True,
                    )
                ]
                * 8,
            )
        self.sse(cancel=True)

    def malformed(self) -> None:
        host, port = self.server.http_url.rsplit(":", 1)
        self._run_all(
            "malformed_headers",
            [
                functools.partial(malformed_once, host, int(port), p, self.timeout_s)
                for p in MALFORMED
            ],
        )

    def _inject(self, duration_s: float) -> None:
        actions: dict[str, Callable[[], None]] = {
            "sigsegv": self.sigsegv, "flood": self.flood, "sse": self.sse,
            "cancel": self.cancel, "malformed": self.malformed,
        }  # fmt: skip
        order = [f for f in self.fault_names if f in actions]
        i = 0
        while (
            not self._stop.wait(self.fault_interval_s) and self.now() < duration_s - self.cooldown_s
        ):
            if not order:
                return
            fault = order[i % len(order)]
            if i % len(order) == 0:  # a new round in a random order, a stub kill first
                self.random.shuffle(order)
                order.sort(key=lambda f: f != "sigsegv")
                fault = order[0]
            i += 1
            # each fault on its own thread: a long flood must not delay the next kill
            thread = threading.Thread(target=self._fault, args=(fault, actions[fault]), daemon=True)
            thread.start()
            self._faults.append((fault, thread))

    def _fault(self, name: str, action: Callable[[], None]) -> None:
        try:
            action()
        except Exception:
            log.exception("chaos: fault %s failed to inject", name)

    # -- the run -------------------------------------------------------------------------------
    def run(self, duration_s: float) -> ChaosReport:
        injector = threading.Thread(target=self._inject, args=(duration_s,), daemon=True)
        injector.start()
        self._traffic(duration_s)
        self._stop.set()
        # The end is bounded too: whatever has not returned by then is reported hung.
        deadline = time.monotonic() + self.timeout_s * 4
        injector.join(timeout=max(0.0, deadline - time.monotonic()))
        for _, thread in self._faults:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        while self._inflight and time.monotonic() < deadline:
            time.sleep(0.1)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._give_up()
        return self.report(duration_s)

    def _give_up(self) -> None:
        """Record what did not return by the end: traffic as hung outcomes, running faults as
        one hung each (their requests are still out)."""
        with self._lock:
            now = self.now()
            for target, started in self._inflight.values():
                error = "no outcome by the end of the run"
                self.outcomes.append(
                    Outcome(target.pipeline, target.model, started, now, outcomes.HUNG, error)
                )
            self._inflight.clear()
        for name, thread in self._faults:
            if thread.is_alive():
                log.warning("chaos: fault %s still running at the end: counted hung", name)
                self._count(name, outcomes.HUNG)

    def report(self, duration_s: float) -> ChaosReport:
        report = ChaosReport(duration_s=duration_s, rate_per_s=self.rate_per_s)
        killed = {p for k in self.kills for p in k.pipelines}
        for target in self.targets:
            report.pipelines.setdefault(target.pipeline, PipelineReport())
        for o in self.outcomes:
            p = report.pipelines.setdefault(o.pipeline, PipelineReport())
            p.sent += 1
            setattr(p, o.kind, getattr(p, o.kind) + 1)
            if o.kind != outcomes.OK:
                key = f"{o.model}: {o.error[:120]}"
                p.errors[key] = p.errors.get(key, 0) + 1
        for name, p in report.pipelines.items():
            p.stub_killed = name in killed
            p.flooded = name in self.flooded
            models = {o.model for o in self.outcomes if o.pipeline == name}
            gaps = [
                outcomes.longest_gap_s([o for o in self.outcomes if o.model == m]) for m in models
            ]
            p.longest_unavailable_s = round(max(gaps, default=0.0), 2)
        for i, kill in enumerate(self.kills):
            until = self.kills[i + 1].at_s if i + 1 < len(self.kills) else self.now()
            back = back_after_s(kill, self.outcomes, until)
            kill.back_after_s = None if back is None else round(back, 2)
        report.kills = self.kills
        report.faults = self.fault_counts
        health = self.supervisor.health()
        report.server_restarts = health.server_restarts
        report.model_reloads = health.model_reloads
        return report


FAULTS = ("sigsegv", "flood", "sse", "cancel", "malformed")


def run_chaos(
    repository: Path,
    duration_s: float,
    rate_per_s: float,
    seed: int = 0,
    faults: Sequence[str] = FAULTS,
    fault_interval_s: float = 10.0,
    timeout_s: float = 60.0,
    min_ok_ratio: float = 0.999,
    max_recovery_s: float = 10.0,
    sse_streams: int = 64,
    cooldown_s: float | None = None,
) -> ChaosReport:
    """Serve ``repository`` supervised, run the chaos, stop; the report with its breaches."""
    settings = ServerSettings.ephemeral(repository, model_control_mode="explicit")
    server = EmbeddedServer(settings)
    server.start()
    supervisor = None
    try:
        server.wait_ready()
        supervisor = Supervisor(server, canary_interval_s=1.0, poll_interval_s=0.2).start()
        chaos = Chaos(
            server, supervisor, rate_per_s, timeout_s, seed, faults, fault_interval_s,
            sse_streams=sse_streams,
            cooldown_s=max_recovery_s + 5 if cooldown_s is None else cooldown_s,
        )  # fmt: skip
        report = chaos.run(duration_s)
    finally:
        if supervisor is not None:
            supervisor.stop()
        server.stop()
    report.breaches = outcomes.gates(report, min_ok_ratio, max_recovery_s)
    return report
