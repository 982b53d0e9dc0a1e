"""``python -m tritonforge.loadtest.reliability.chaos`` (``make chaos``): a bounded chaos run, supervised.

Serves the repository as ``serve`` does (explicit model control, the supervisor, the front),
sends mixed traffic at a fixed rate through every public model of every discovered pipeline
(gRPC and HTTP alternately; decoupled models over gRPC streams), and meanwhile a seeded fault
injector, every ``--fault-interval-s`` until ``--max-recovery-s`` + 5 s before the end, in turn: SIGSEGVs a random Python stub, floods a
decoupled (generate) model past its queue (``max_running + max_queue`` from its config, plus
``--flood-extra``), opens ``--sse-streams`` SSE streams at once, cancels gRPC streams and SSE
streams mid-answer, and sends malformed HTTP headers to the front.

It reports, per pipeline, requests sent / answered OK / answered with a clean error (an HTTP
status or gRPC status from the server) / shed (a clean overload refusal while that pipeline was
being flooded) / lost (connection reset, stream ended without its final response) / hung (no
answer within ``--timeout-s``), the longest unavailability (of any of its public models: no OK
answer in between), for each
killed stub when its pipeline answered again, and the supervisor's whole-server restarts. Exit 1
when a gate is breached (:func:`gates`): any lost or hung request; a pipeline whose own stub was
not killed answering < ``--min-ok-ratio`` of its requests OK (shed ones aside); a killed stub's
pipeline not back within ``--max-recovery-s``; any whole-server restart.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import functools
import http.client
import json
import logging
import os
import queue
import random
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tritonforge.logs import run_main
from tritonforge.modelconfig import ModelConfig
from tritonforge.pipelines import from_repository
from tritonforge.repository import load_model_config
from tritonforge.runtime.server import EmbeddedServer, ServerSettings
from tritonforge.runtime.supervisor import (
    OVERLOADED,
    Supervisor,
    callees,
    classify_failure,
    stop_stream,
)

log = logging.getLogger(__name__)

OK, CLEAN, SHED, LOST, HUNG = "ok", "clean_error", "shed", "lost", "hung"
_LOST_WORDS = (
    "reset",
    "socket closed",
    "broken pipe",
    "connection refused",
    "eof",
    "failed to connect",
)


@dataclass
class Outcome:
    pipeline: str
    model: str
    started_s: float
    ended_s: float
    kind: str
    error: str = ""


@dataclass
class Kill:
    at_s: float
    instance: str
    model: str
    pipelines: list[str]
    public_models: list[str]
    back_after_s: float | None = None


@dataclass
class PipelineReport:
    sent: int = 0
    ok: int = 0
    clean_error: int = 0
    shed: int = 0
    lost: int = 0
    hung: int = 0
    longest_unavailable_s: float = 0.0
    stub_killed: bool = False
    flooded: bool = False
    errors: dict[str, int] = field(default_factory=dict)  # "model: error" (first 120 chars)

    @property
    def ok_ratio(self) -> float:
        counted = self.sent - self.shed
        return self.ok / counted if counted else 1.0


@dataclass
class ChaosReport:
    duration_s: float
    rate_per_s: float
    pipelines: dict[str, PipelineReport] = field(default_factory=dict)
    kills: list[Kill] = field(default_factory=list)
    faults: dict[str, dict[str, int]] = field(default_factory=dict)
    server_restarts: int = 0
    model_reloads: int = 0
    breaches: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for name, p in self.pipelines.items():
            out["pipelines"][name]["ok_ratio"] = round(p.ok_ratio, 5)
        return out


def outcome_kind(error: str, timed_out: bool = False) -> str:
    """How a failed request ended: hung (the client gave up: no answer in time), lost (the
    connection or stream broke without an answer) or a clean error (the server answered with a
    status, a server-side timeout included: Triton's "Request timeout expired", generate's
    "queued longer than queue_timeout_s", the front's "no answer from tritonserver")."""
    lowered = error.lower()
    client_gave_up = ("deadline exceeded", "deadline_exceeded", "timed out", "no final response")
    gave_up = timed_out or any(w in lowered for w in client_gave_up)
    if gave_up and "no answer from tritonserver" not in lowered:  # the front's own is clean
        return HUNG
    if any(w in lowered for w in _LOST_WORDS):
        return LOST
    return CLEAN


def is_down(o: Outcome) -> bool:
    """Whether ``o`` says its model was down: lost, hung, or a clean error that is not an
    overload refusal (a full queue or a queue deadline says the model is up and busy)."""
    if o.kind in (LOST, HUNG):
        return True
    return o.kind == CLEAN and classify_failure(o.error) != OVERLOADED


def longest_gap_s(outcomes: Sequence[Outcome]) -> float:
    """Longest time without an OK answer: from the first request that found the model down
    (:func:`is_down`) after an OK one to the next OK answer (or the last failure)."""
    longest = 0.0
    down_since: float | None = None
    for o in sorted(outcomes, key=lambda o: o.started_s):
        if o.kind == OK:
            if down_since is not None:
                longest = max(longest, o.ended_s - down_since)
                down_since = None
        elif is_down(o) and down_since is None:
            down_since = o.started_s
    if down_since is not None:
        last = max(o.ended_s for o in outcomes)
        longest = max(longest, last - down_since)
    return longest


def back_after_s(kill: Kill, outcomes: Sequence[Outcome], until_s: float) -> float | None:
    """Seconds from ``kill`` until every public model that calls the killed one answered OK
    again after its last request in [kill, until_s) that found it down (:func:`is_down`: an
    overload refusal, e.g. under a flood that came later, is not down); 0 when none failed,
    None when one never came back."""
    worst = 0.0
    for model in kill.public_models:
        window = [o for o in outcomes if o.model == model and kill.at_s <= o.started_s < until_s]
        failed = [o.started_s for o in window if is_down(o)]
        if not failed:
            continue
        oks = [o.ended_s for o in window if o.kind == OK and o.started_s > max(failed)]
        if not oks:
            return None
        worst = max(worst, min(oks) - kill.at_s)
    return worst


def gates(report: ChaosReport, min_ok_ratio: float, max_recovery_s: float) -> list[str]:
    """What the run breached (empty: passed)."""
    breaches = []
    for name, p in report.pipelines.items():
        if p.lost or p.hung:
            breaches.append(f"{name}: {p.lost} lost and {p.hung} hung requests (gate: 0)")
        if not p.stub_killed and not p.flooded and p.ok_ratio < min_ok_ratio:
            breaches.append(
                f"{name}: {p.ok_ratio:.4%} of requests OK, neither killed nor flooded "
                f"(gate: >= {min_ok_ratio:.1%})"
            )
    for fault, counts in report.faults.items():
        if counts.get(LOST, 0) or counts.get(HUNG, 0):
            breaches.append(
                f"{fault}: {counts.get(LOST, 0)} lost and {counts.get(HUNG, 0)} hung (gate: 0)"
            )
    for kill in report.kills:
        if kill.back_after_s is None or kill.back_after_s > max_recovery_s:
            back = "never" if kill.back_after_s is None else f"after {kill.back_after_s:.1f} s"
            breaches.append(
                f"SIGSEGV of {kill.instance}: {', '.join(kill.pipelines)} back {back} "
                f"(gate: {max_recovery_s:g} s)"
            )
    if report.server_restarts:
        breaches.append(
            f"{report.server_restarts} whole-server restarts (gate: 0; only a tritonserver exit "
            "may restart it)"
        )
    return breaches


def text_tensor(module: Any, name: str, text: str, batched: bool) -> Any:
    value = np.array([[text.encode()]] if batched else [text.encode()], dtype=np.object_)
    tensor = module.InferInput(name, list(value.shape), "BYTES")
    tensor.set_data_from_numpy(value)
    return tensor


def stream_once(
    url: str, model: str, inputs: list[Any], max_tokens: int, timeout_s: float,
    cancel_after_first: bool = False,
) -> tuple[str, str]:  # fmt: skip
    """One gRPC stream request; (kind, error). Cancelled after the first response when asked
    (then "ok" once that response came)."""
    import tritonclient.grpc as grpcclient

    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        client.async_stream_infer(
            model, inputs, parameters={"max_tokens": max_tokens}, enable_empty_final_response=True
        )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                result, error = responses.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                return HUNG, f"no final response within {timeout_s:g} s"
            if error is not None:
                text = f"{error.status() or ''} {error}"
                return outcome_kind(text), text[:300]
            if cancel_after_first:
                return OK, ""
            final = result.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                return OK, ""
    except Exception as e:  # the stream itself broke
        # "The stream is no longer in valid state, the error detail is reported through provided
        # callback": the server refused the stream (e.g. the front's max_open_streams); its
        # answer is the callback's error
        with contextlib.suppress(queue.Empty):
            _, error = responses.get(timeout=2.0)
            if error is not None:
                text = f"{error.status() or ''} {error}"
                return outcome_kind(text), text[:300]
        return outcome_kind(str(e)), f"{type(e).__name__}: {e}"[:300]
    finally:
        with contextlib.suppress(Exception):
            stop_stream(client)
        client.close()


def sse_once(
    http_url: str, model: str, body: dict[str, Any], timeout_s: float, cancel_after_first: bool
) -> tuple[str, str]:
    """One SSE ``generate_stream`` request read to its end (or dropped after the first event);
    (kind, error)."""
    host, port = http_url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
    try:
        conn.request(
            "POST", f"/v2/models/{model}/generate_stream", json.dumps(body),
            {"Content-Type": "application/json"},
        )  # fmt: skip
        resp = conn.getresponse()
        if resp.status != 200:
            resp.read()
            return CLEAN, f"HTTP {resp.status}"
        events = 0
        errored = ""
        for line in resp:
            if line.startswith(b"data: "):
                events += 1
                if b'"error"' in line:
                    errored = line[6:200].decode("utf-8", "replace")
                if cancel_after_first:
                    return OK, ""
        if errored:
            return CLEAN, errored
        return (OK, "") if events else (LOST, "stream ended without an event")
    except TimeoutError:
        return HUNG, f"no answer within {timeout_s:g} s"
    except (OSError, http.client.HTTPException) as e:
        return outcome_kind(f"{type(e).__name__} {e}"), f"{type(e).__name__}: {e}"[:300]
    finally:
        conn.close()


MALFORMED = (
    b"POST /v2/models/x/infer HTTP/1.1\r\nHost: a\r\nContent-Length: abc\r\n\r\n",
    b"GET /v2/health/ready HTTP/1.1\r\nHost a\r\nno-colon-here\r\n\r\n",
    b"GET /v2/health/ready HTTP/1.1\r\nHost: a\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n",
    b"POST /v2/models/x/infer HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"GET /v2/health/ready HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(64),
)


def malformed_once(host: str, port: int, payload: bytes, timeout_s: float) -> tuple[str, str]:
    """Send one malformed request; a status line back (or the connection closed by the front at
    once, which is how it refuses garbage) is clean, silence until the timeout is hung."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(payload)
            data = sock.recv(64)
    except TimeoutError:
        return HUNG, "no answer"
    except OSError as e:
        return CLEAN, f"closed: {e}"
    if data.startswith(b"HTTP/1.") or not data:
        return CLEAN, data[:40].decode("latin-1")
    return CLEAN, "answered"


@dataclass(frozen=True)
class Target:
    pipeline: str
    model: str
    config: ModelConfig
    input: str

    @property
    def decoupled(self) -> bool:
        return bool(self.config.raw.get("model_transaction_policy", {}).get("decoupled"))


def targets(repository: Path, models: Iterable[str]) -> list[Target]:
    """Every public model (what the supervisor canaries) with its pipeline and text input."""
    owner = {m: p.name for p in from_repository(repository).values() for m in p.public_models}
    out = []
    for model in models:
        config = load_model_config(repository, model)
        text_input = next(
            (s.name for s in config.inputs if not s.optional and s.wire_dtype == "BYTES"), None
        )
        if text_input is not None:
            out.append(Target(owner.get(model, model), model, config, text_input))
    return out


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
        kind, error = OK, ""
        if target.decoupled:
            tensor = text_tensor(grpcclient, target.input, text, batched=False)
            kind, error = stream_once(
                self.server.grpc_url, target.model, [tensor], 2, self.timeout_s
            )
        else:
            grpc_client, http_client = self._clients()
            try:
                if n % 2:
                    tensor = text_tensor(grpcclient, target.input, text, target.config.batched)
                    grpc_client.infer(target.model, [tensor], client_timeout=self.timeout_s)
                else:
                    tensor = text_tensor(httpclient, target.input, text, target.config.batched)
                    http_client.infer(target.model, [tensor])
            except Exception as e:  # every failure is classified below
                status = getattr(e, "status", lambda: None)()
                error = f"{type(e).__name__}: {status or ''} {e}"[:300]
                kind = outcome_kind(error)
                if kind in (HUNG, LOST):  # a fresh connection for the next request
                    for client in self._clients():
                        with contextlib.suppress(Exception):
                            client.close()
                    del self._local.grpc
        if (
            kind == CLEAN
            and classify_failure(error) == OVERLOADED
            and self.flooded_during(target.pipeline, started, self.now())
        ):
            kind = SHED
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
                if kind in (LOST, HUNG):
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
        self._count("sigsegv", OK)

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
                    Outcome(target.pipeline, target.model, started, now, HUNG, error)
                )
            self._inflight.clear()
        for name, thread in self._faults:
            if thread.is_alive():
                log.warning("chaos: fault %s still running at the end: counted hung", name)
                self._count(name, HUNG)

    def report(self, duration_s: float) -> ChaosReport:
        report = ChaosReport(duration_s=duration_s, rate_per_s=self.rate_per_s)
        killed = {p for k in self.kills for p in k.pipelines}
        for target in self.targets:
            report.pipelines.setdefault(target.pipeline, PipelineReport())
        for o in self.outcomes:
            p = report.pipelines.setdefault(o.pipeline, PipelineReport())
            p.sent += 1
            setattr(p, o.kind, getattr(p, o.kind) + 1)
            if o.kind != OK:
                key = f"{o.model}: {o.error[:120]}"
                p.errors[key] = p.errors.get(key, 0) + 1
        for name, p in report.pipelines.items():
            p.stub_killed = name in killed
            p.flooded = name in self.flooded
            models = {o.model for o in self.outcomes if o.pipeline == name}
            gaps = [longest_gap_s([o for o in self.outcomes if o.model == m]) for m in models]
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


def print_report(report: ChaosReport) -> None:
    print(
        f"{'pipeline':<12} {'sent':>6} {'ok':>6} {'clean':>6} {'shed':>5} {'lost':>5} {'hung':>5} "
        f"{'ok%':>8} {'longest_down_s':>14}  stub killed"
    )
    for name, p in report.pipelines.items():
        print(
            f"{name:<12} {p.sent:6d} {p.ok:6d} {p.clean_error:6d} {p.shed:5d} {p.lost:5d} "
            f"{p.hung:5d} {p.ok_ratio:8.3%} {p.longest_unavailable_s:14.1f}  {p.stub_killed}"
        )
    for kill in report.kills:
        back = "never" if kill.back_after_s is None else f"{kill.back_after_s:.1f} s"
        print(
            f"SIGSEGV {kill.instance} at {kill.at_s:.1f} s: {', '.join(kill.pipelines)} back {back}"
        )
    for fault, counts in report.faults.items():
        print(f"fault {fault}: {json.dumps(counts)}")
    for name, p in report.pipelines.items():
        for error, count in sorted(p.errors.items(), key=lambda kv: -kv[1])[:5]:
            print(f"  {name} x{count}: {error}")
    print(f"whole-server restarts: {report.server_restarts}; model reloads: {report.model_reloads}")


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
    report.breaches = gates(report, min_ok_ratio, max_recovery_s)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tritonforge.loadtest.reliability.chaos", description=__doc__
    )
    p.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    p.add_argument("--duration-s", type=float, default=600.0)
    p.add_argument("--rate", type=float, default=20.0, help="requests per second, all pipelines")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated of {FAULTS}")
    p.add_argument("--fault-interval-s", type=float, default=10.0)
    p.add_argument(
        "--timeout-s", type=float, default=60.0,
        help="per request (a flood's streams: 3x); no answer by then: hung",
    )  # fmt: skip
    p.add_argument("--min-ok-ratio", type=float, default=0.999)
    p.add_argument("--max-recovery-s", type=float, default=10.0)
    p.add_argument("--sse-streams", type=int, default=64)
    p.add_argument("--report", type=Path, default=Path("reports/chaos.json"))
    args = p.parse_args(argv)
    report = run_chaos(
        args.model_repository, args.duration_s, args.rate, args.seed,
        [f.strip() for f in args.faults.split(",") if f.strip()], args.fault_interval_s,
        args.timeout_s, args.min_ok_ratio, args.max_recovery_s, args.sse_streams,
    )  # fmt: skip
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(report.to_json(), indent=2))
    print_report(report)
    for breach in report.breaches:
        print(f"CHAOS FAILED: {breach}")
    if not report.breaches:
        print("chaos passed: every gate held")
    return 1 if report.breaches else 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
