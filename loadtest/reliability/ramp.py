"""A ramp past capacity, with degradation on and off: per-second answered fp32 / int8, refused,
failed, p99 (issue #24).

``python -m tritonforge.loadtest.reliability.ramp --host http://127.0.0.1:8000`` (or, without ``--host``, an
embedded server of ``--model-repository`` on free ports) measures the saturation
rate of ``embed_bls`` (closed loop, ``--saturation-users``), then runs the Locust scenario
(:mod:`loadtest.locust.ramp`) three times: a ramp to ``--peak-factor`` (3) x that rate held
for ``--peak-s`` (60) with ``fallback=none`` (today's behaviour), the same with
``fallback=int8``, and the same through :class:`client.sync.EmbeddingClient` with its circuit
breaker. Each HTTP user sends one request per second whatever the latency (open loop), so the
number of users is the offered rate. ``make ramp`` runs it; it is a benchmark, not part of
``make test``.

The gate (:func:`gate`, exit code 1 when breached): with degradation off nothing is answered by
int8 (today's behaviour) and the peak is past capacity (something is refused); with it on the
refused share falls and the answered requests' p99 stays under the SLO gate (``--slo-p99-ms``,
the load tests' :class:`loadtest.slo.SloThresholds` p99 by default); the degraded share is
reported. The client ramp is reported, not gated.

This module's functions are plain (no Locust import) so tests use them.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from tritonforge.loadtest.errors import LoadtestError
from tritonforge.loadtest.locust import RAMP_LOCUSTFILE
from tritonforge.loadtest.slo import AsDict, SloThresholds

OUTCOMES = ("fp32", "int8", "refused", "breaker_open", "failed")
LOCUSTFILE = RAMP_LOCUSTFILE


class RampError(LoadtestError):
    """A ramp plan or its results are not usable; the message names what is wrong."""


@dataclass(frozen=True)
class RampPlan:
    """``base_users`` -> ``peak_users`` linearly over ``ramp_s``, then ``peak_s`` at the peak."""

    base_users: int
    peak_users: int
    ramp_s: float
    peak_s: float

    def __post_init__(self) -> None:
        if not 1 <= self.base_users <= self.peak_users:
            raise RampError(f"need 1 <= base_users <= peak_users, got {self}")
        if self.ramp_s < 0 or self.peak_s <= 0:
            raise RampError(f"ramp_s must be >= 0 and peak_s > 0, got {self}")

    @property
    def duration_s(self) -> float:
        return self.ramp_s + self.peak_s

    def users_at(self, t_s: float) -> int | None:
        """Users to run ``t_s`` after the start; None once the plan is over."""
        if t_s >= self.duration_s:
            return None
        if t_s >= self.ramp_s:
            return self.peak_users
        return self.base_users + round((self.peak_users - self.base_users) * t_s / self.ramp_s)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def per_second(
    samples: Sequence[tuple[float, float, str]], start_s: float
) -> list[dict[str, float]]:
    """``(end time, latency ms, outcome)`` -> one row per second since ``start_s``: the count of
    each outcome and the p99 of the answered (fp32/int8) requests that ended in it."""
    rows: dict[int, dict[str, float]] = {}
    latencies: dict[int, list[float]] = {}
    for end_s, latency_ms, outcome in samples:
        second = int(end_s - start_s)
        row = rows.setdefault(second, {"second": second, **dict.fromkeys(OUTCOMES, 0)})
        row[outcome if outcome in OUTCOMES else "failed"] += 1
        if outcome in ("fp32", "int8"):
            latencies.setdefault(second, []).append(latency_ms)
    for second, row in rows.items():
        row["p99_ms"] = round(percentile(latencies.get(second, []), 0.99), 1)
    return [rows[s] for s in sorted(rows)]


@dataclass(frozen=True)
class RampReport(AsDict):
    """What one ramp run proves: shares of all requests, and the p99 of the answered ones."""

    requests: int
    answered_fp32: int
    answered_int8: int
    refused: int
    breaker_open: int
    failed: int
    refused_share: float
    degraded_share: float
    p99_ms: float
    slo_p99_ms: float
    p99_ok: bool


def report(samples: Sequence[tuple[float, float, str]], slo_p99_ms: float) -> RampReport:
    counts = {o: sum(1 for _, _, out in samples if out == o) for o in OUTCOMES}
    counts["failed"] = len(samples) - sum(counts[o] for o in OUTCOMES if o != "failed")
    answered = [ms for _, ms, out in samples if out in ("fp32", "int8")]
    total = max(1, len(samples))
    p99 = percentile(answered, 0.99)
    return RampReport(
        requests=len(samples),
        answered_fp32=counts["fp32"],
        answered_int8=counts["int8"],
        refused=counts["refused"],
        breaker_open=counts["breaker_open"],
        failed=counts["failed"],
        refused_share=round(counts["refused"] / total, 4),
        degraded_share=round(counts["int8"] / max(1, len(answered)), 4),
        p99_ms=round(p99, 1),
        slo_p99_ms=slo_p99_ms,
        p99_ok=bool(answered) and p99 <= slo_p99_ms,
    )


def gate(results: Mapping[str, object]) -> list[str]:
    """The ramp's verdict from the reports of its ``degrade_off`` and ``degrade_on`` runs: every
    breach as a sentence (empty: passed)."""
    off, on = (_report(results, name) for name in ("degrade_off", "degrade_on"))
    breaches = []
    if off["answered_int8"]:
        breaches.append(
            f"degradation off answered {off['answered_int8']} requests from int8 (must be "
            "today's behaviour: fp32 or refused)"
        )
    if not off["refused"]:
        breaches.append("degradation off refused nothing: the peak never passed capacity")
    elif on["refused_share"] >= off["refused_share"]:
        breaches.append(
            f"degradation on refused {on['refused_share']:.1%} of the requests, not fewer than "
            f"off ({off['refused_share']:.1%})"
        )
    if not on["p99_ok"]:
        breaches.append(
            f"degradation on: p99 of the answered {on['p99_ms']:.0f} ms > the SLO gate "
            f"{on['slo_p99_ms']:g} ms"
        )
    return breaches


def _report(results: Mapping[str, object], name: str) -> dict[str, float]:
    run = results.get(name)
    summary = run.get("report") if isinstance(run, dict) else None
    if not isinstance(summary, dict):
        raise RampError(f"the ramp results have no {name!r} report")
    return summary


# Triton's cumulative per-model counters (/metrics) that split a request's time.
_TIME_METRICS = {
    "nv_inference_request_success": "requests",
    "nv_inference_exec_count": "executions",
    "nv_inference_queue_duration_us": "queue_us",
    "nv_inference_compute_infer_duration_us": "compute_us",
}


def parse_model_metrics(text: str) -> dict[str, dict[str, float]]:
    """``/metrics`` text -> model -> {requests, executions, queue_us, compute_us} (summed over
    versions)."""
    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        key = _TIME_METRICS.get(name)
        if key is None or 'model="' not in rest:
            continue
        model = rest.split('model="', 1)[1].split('"', 1)[0]
        row = out.setdefault(model, dict.fromkeys(_TIME_METRICS.values(), 0.0))
        row[key] += float(rest.rsplit(" ", 1)[1])
    return out


def where_time_went(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    """Per model that answered requests between the two scrapes: requests, mean requests per
    execution, mean queue and compute ms per request (Triton's own view, not the client's)."""
    out = {}
    for model, now in after.items():
        was = before.get(model, dict.fromkeys(now, 0.0))
        d = {k: now[k] - was.get(k, 0.0) for k in now}
        if d["requests"] <= 0:
            continue
        out[model] = {
            "requests": d["requests"],
            "requests_per_execution": round(d["requests"] / max(1.0, d["executions"]), 1),
            "queue_ms": round(d["queue_us"] / d["requests"] / 1000.0, 1),
            "compute_ms": round(d["compute_us"] / d["requests"] / 1000.0, 1),
        }
    return out


def _scrape(url: str) -> dict[str, dict[str, float]]:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return parse_model_metrics(response.read().decode())
    except OSError:
        return {}


def locust_ramp(
    host: str,
    user: str,
    plan: RampPlan,
    out: Path,
    *,
    fallback: str,
    slo_p99_ms: float,
    extra: Sequence[str] = (),
) -> dict[str, object]:
    """One headless Locust run of :data:`LOCUSTFILE`; returns its JSON report."""
    command = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(LOCUSTFILE),
        "--headless",
        "--host",
        host,
        "--only-summary",
        "--stop-timeout",
        "10",
        "--ramp-base-users",
        str(plan.base_users),
        "--ramp-peak-users",
        str(plan.peak_users),
        "--ramp-s",
        str(plan.ramp_s),
        "--ramp-peak-s",
        str(plan.peak_s),
        "--ramp-fallback",
        fallback,
        "--ramp-out",
        str(out),
        "--slo-p99-ms",
        str(slo_p99_ms),
        *extra,
        user,
    ]
    subprocess.run(command, check=False, timeout=plan.duration_s + 120)
    return dict(json.loads(out.read_text()))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="", help="the server's HTTP URL (the front)")
    parser.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--saturation-rps", type=float, default=0.0, help="skip measuring it")
    parser.add_argument(
        "--saturation-users",
        type=int,
        default=64,
        help="closed-loop users measuring the saturation rate: enough to keep both BLS "
        "instances' batches full (8 measured half the open-loop capacity)",
    )
    parser.add_argument("--peak-factor", type=float, default=3.0)
    parser.add_argument("--ramp-s", type=float, default=20.0)
    parser.add_argument("--peak-s", type=float, default=60.0)
    parser.add_argument("--saturation-s", type=float, default=15.0)
    parser.add_argument(
        "--slo-p99-ms",
        type=float,
        default=SloThresholds().p99_ms,
        help="the p99 gate of the answered requests with degradation on (the load tests' SLO)",
    )
    parser.add_argument("--out", type=Path, default=Path("build/ramp.json"))
    parser.add_argument(
        "--metrics-url",
        default="",
        help="Triton's /metrics, to split each run's time per model into queue and compute "
        "(default: the embedded server's; none with --host)",
    )
    parser.add_argument(
        "locust_args",
        nargs="*",
        help="after --: passed to every Locust run (e.g. --texts-per-request 4)",
    )
    args = parser.parse_args(argv)
    if args.host:
        return run(args)
    from tritonforge.runtime.serving import serving

    with serving(args.model_repository) as server:
        args.host = f"http://{server.wait_ready().http_url}"
        args.extra = ("--model-repository", str(args.model_repository))  # discovery from files
        args.metrics_url = args.metrics_url or server.metrics_url
        return run(args)


def run(args: argparse.Namespace) -> int:
    """Measure (or take) the saturation rate, run the three ramps, write ``--out``; 1 when the
    :func:`gate` is breached."""
    extra: Sequence[str] = (*getattr(args, "extra", ()), *args.locust_args)
    with tempfile.TemporaryDirectory() as tmp:
        rate = args.saturation_rps
        if rate <= 0:
            measured = locust_ramp(
                args.host,
                "RampSaturationUser",
                RampPlan(args.saturation_users, args.saturation_users, 0, args.saturation_s),
                Path(tmp) / "saturation.json",
                fallback="none",
                slo_p99_ms=args.slo_p99_ms,
                extra=extra,
            )
            answered = measured["report"]
            assert isinstance(answered, dict)
            rate = (answered["answered_fp32"] + answered["answered_int8"]) / args.saturation_s
        peak = max(2, round(args.peak_factor * rate))
        plan = RampPlan(1, peak, args.ramp_s, args.peak_s)
        results: dict[str, object] = {"saturation_rps": round(rate, 2), "plan": asdict(plan)}
        for name, user, fallback in (
            ("degrade_off", "RampHttpUser", "none"),
            ("degrade_on", "RampHttpUser", "int8"),
            ("client_breaker", "RampClientUser", "none"),
        ):
            before = _scrape(args.metrics_url) if args.metrics_url else {}
            results[name] = locust_ramp(
                args.host,
                user,
                plan,
                Path(tmp) / f"{name}.json",
                fallback=fallback,
                slo_p99_ms=args.slo_p99_ms,
                extra=extra,
            )
            if args.metrics_url:
                triton = where_time_went(before, _scrape(args.metrics_url))
                results[name]["triton"] = triton  # type: ignore[index]
                print(f"{name} (Triton's view): {json.dumps(triton)}")
            summary = results[name]["report"]  # type: ignore[index]
            print(f"{name}: {json.dumps(summary)}")
    breaches = gate(results)
    results["gate"] = {"passed": not breaches, "breaches": breaches}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"per-second rows in {args.out}")
    if breaches:
        print("RAMP GATE BREACHED: " + "; ".join(breaches), file=sys.stderr)
        return 1
    print("RAMP GATE OK: fewer refused with degradation on, p99 under the SLO gate")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
