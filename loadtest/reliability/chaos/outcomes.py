"""What a chaos run observed: each request's outcome, the stub kills, the per-pipeline report,
the gates (:func:`gates`) and the printed report."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tritonforge.runtime.supervisor.canaries import OVERLOADED, classify_failure

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
