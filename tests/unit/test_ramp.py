"""loadtest.reliability.ramp's plain functions: the ramp plan, the per-second rows and the report."""

from __future__ import annotations

import argparse

import pytest

from tritonforge.loadtest.reliability import ramp as ramp_module
from tritonforge.loadtest.reliability.ramp import (
    RampError,
    RampPlan,
    gate,
    parse_model_metrics,
    per_second,
    report,
    where_time_went,
)
from tritonforge.loadtest.slo import SloThresholds


def test_plan_ramps_linearly_then_holds_the_peak_then_stops() -> None:
    plan = RampPlan(base_users=2, peak_users=12, ramp_s=10.0, peak_s=5.0)
    assert [plan.users_at(t) for t in (0.0, 5.0, 9.9, 10.0, 14.9)] == [2, 7, 12, 12, 12]
    assert plan.users_at(15.0) is None and plan.duration_s == 15.0
    assert RampPlan(3, 3, 0.0, 1.0).users_at(0.0) == 3  # no ramp: straight to the peak
    with pytest.raises(RampError, match="base_users"):
        RampPlan(5, 4, 1.0, 1.0)
    with pytest.raises(RampError, match="peak_s"):
        RampPlan(1, 4, 1.0, 0.0)


SAMPLES = [
    (100.2, 10.0, "fp32"),
    (100.7, 30.0, "int8"),
    (100.9, 1.0, "refused"),
    (101.1, 50.0, "fp32"),
    (101.5, 2.0, "breaker_open"),
    (101.6, 5.0, "something else"),
]


def test_per_second_rows_count_each_outcome_and_the_answered_p99() -> None:
    rows = per_second(SAMPLES, start_s=100.0)
    assert [r["second"] for r in rows] == [0, 1]
    first, second = rows
    assert (first["fp32"], first["int8"], first["refused"]) == (1, 1, 1)
    assert first["p99_ms"] == 30.0  # refusals are fast: they do not flatter the p99
    assert (second["fp32"], second["breaker_open"], second["failed"]) == (1, 1, 1)
    assert second["p99_ms"] == 50.0


def test_report_shares_and_the_p99_gate() -> None:
    r = report(SAMPLES, slo_p99_ms=40.0)
    assert (r.requests, r.answered_fp32, r.answered_int8, r.refused) == (6, 2, 1, 1)
    assert (r.breaker_open, r.failed) == (1, 1)
    assert r.refused_share == round(1 / 6, 4)
    assert r.degraded_share == round(1 / 3, 4)  # of the answered
    assert r.p99_ms == 50.0 and not r.p99_ok
    assert report(SAMPLES, slo_p99_ms=50.0).p99_ok
    assert not report([(1.0, 1.0, "refused")], 100.0).p99_ok  # nothing answered is no pass


def _run(
    requests: int, fp32: int, int8: int, refused: int, p99_ok: bool = True
) -> dict[str, object]:
    summary = report(
        [(1.0, 10.0, "fp32")] * fp32
        + [(1.0, 10.0, "int8")] * int8
        + [(1.0, 1.0, "refused")] * refused
        + [(1.0, 1.0, "failed")] * (requests - fp32 - int8 - refused),
        slo_p99_ms=100.0 if p99_ok else 1.0,
    )
    return {"report": summary.as_dict(), "seconds": []}


def test_the_gate_passes_when_degrading_refuses_less_within_the_slo() -> None:
    results = {"degrade_off": _run(100, 40, 0, 60), "degrade_on": _run(100, 5, 70, 25)}
    assert gate(results) == []


def test_the_gate_names_each_breach() -> None:
    not_fewer = gate({"degrade_off": _run(100, 40, 0, 30), "degrade_on": _run(100, 0, 70, 30)})
    assert len(not_fewer) == 1 and "not fewer than off (30.0%)" in not_fewer[0]
    slow = gate({"degrade_off": _run(10, 4, 0, 6), "degrade_on": _run(10, 0, 9, 1, False)})
    assert len(slow) == 1 and "p99" in slow[0] and "SLO gate 1 ms" in slow[0]
    # off must be today's behaviour, and a peak that refused nothing proves nothing
    off_degraded = gate({"degrade_off": _run(10, 4, 1, 0), "degrade_on": _run(10, 0, 10, 0)})
    assert any("off answered 1 requests from int8" in b for b in off_degraded)
    assert any("never passed capacity" in b for b in off_degraded)
    with pytest.raises(RampError, match="degrade_on"):
        gate({"degrade_off": _run(10, 4, 0, 6)})


def test_the_ramp_gates_p99_on_the_load_tests_slo_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    captured: list[argparse.Namespace] = []

    def fake_run(args: argparse.Namespace) -> int:
        captured.append(args)
        return 0

    monkeypatch.setattr(ramp_module, "run", fake_run)
    assert ramp_module.main(["--host", "http://x:1", "--", "--texts-per-request", "2"]) == 0
    assert captured[0].slo_p99_ms == SloThresholds().p99_ms
    assert captured[0].locust_args == ["--texts-per-request", "2"]


METRICS = """# HELP nv_inference_request_success Number of successful inference requests
nv_inference_request_success{model="embed_bls",version="1"} 10
nv_inference_exec_count{model="embed_bls",version="1"} 2
nv_inference_queue_duration_us{model="embed_bls",version="1"} 30000
nv_inference_compute_infer_duration_us{model="embed_bls",version="1"} 50000
nv_inference_request_success{model="encoder_int8",version="1"} 4
nv_inference_request_failure{model="embed_bls",reason="REJECTED",version="1"} 99
"""


def test_where_time_went_splits_each_models_time_per_request() -> None:
    before = parse_model_metrics(METRICS)
    assert before["embed_bls"] == {
        "requests": 10,
        "executions": 2,
        "queue_us": 30000,
        "compute_us": 50000,
    }
    after = parse_model_metrics(
        METRICS.replace("} 10\n", "} 30\n")
        .replace("} 2\n", "} 4\n")
        .replace("} 30000\n", "} 1030000\n")
        .replace("} 50000\n", "} 250000\n")
    )
    assert where_time_went(before, after) == {
        "embed_bls": {
            "requests": 20,
            "requests_per_execution": 10.0,
            "queue_ms": 50.0,
            "compute_ms": 10.0,
        }
    }  # encoder_int8 answered nothing in between: left out
