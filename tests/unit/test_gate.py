"""``make gate``: the perf-baseline comparison (both bench JSON spellings), the hardware gate's
skip, and a summary that names what broke."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tritonforge.deploy import gate

REFERENCE = "fastapi+torch http"


def report(cells: dict[str, float], new_schema: bool = False) -> dict[str, Any]:
    """A bench report with ``{"<label> @<conc>": sent/s}`` cells."""
    rows = []
    for cell, value in cells.items():
        label, _, conc = cell.rpartition(" @")
        if new_schema:  # the reworked bench's spelling
            rows.append({"target": label, "conc": int(conc), "sent_s": value, "p99_ms": 9.0})
        else:
            rows.append({"label": label, "concurrency": int(conc), "sentences_per_s": value})
    return {"cells": rows}


BASELINE = {
    "reference": REFERENCE,
    "tolerance": 0.25,
    "ratios": {"ensemble fp32 grpc @4": 2.0, "bls fp32 grpc @4": 1.0},
}


@pytest.mark.parametrize("new_schema", [False, True], ids=["bench", "reworked-bench"])
def test_ratios_within_tolerance_pass_and_a_drop_names_the_cell(new_schema: bool) -> None:
    fine = report(
        {f"{REFERENCE} @4": 50.0, "ensemble fp32 grpc @4": 80.0, "bls fp32 grpc @4": 40.0},
        new_schema,
    )
    assert gate.compare(BASELINE, fine) == []  # 1.6x >= 2.0 * 0.75, 0.8x >= 0.75
    slow = report(
        {f"{REFERENCE} @4": 50.0, "ensemble fp32 grpc @4": 70.0, "bls fp32 grpc @4": 50.0},
        new_schema,
    )
    (finding,) = gate.compare(BASELINE, slow)
    assert finding.startswith("ensemble fp32 grpc @4: 1.40x") and "1.50x" in finding


def test_machine_speed_cancels_out() -> None:
    fast = {f"{REFERENCE} @4": 500.0, "ensemble fp32 grpc @4": 1000.0, "bls fp32 grpc @4": 500.0}
    slow = {k: v / 10 for k, v in fast.items()}
    assert gate.compare(BASELINE, report(fast)) == gate.compare(BASELINE, report(slow)) == []


def test_unmeasured_cells_and_a_missing_reference_fail() -> None:
    findings = gate.compare(BASELINE, report({"ensemble fp32 grpc @4": 80.0}))
    assert len(findings) == 2 and all("not measured" in f for f in findings)
    with pytest.raises(gate.GateError, match="cells"):
        gate.compare(BASELINE, {"rows": []})
    with pytest.raises(gate.GateError, match="throughput"):
        gate.compare(BASELINE, {"cells": [{"label": "x", "concurrency": 1}]})


def test_perf_gate_reads_a_bench_json_and_reports_what_broke(tmp_path: Path) -> None:
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps(BASELINE))
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(report({f"{REFERENCE} @4": 10.0, "ensemble fp32 grpc @4": 1.0})))
    result = gate.perf_gate(baseline, tmp_path, bench)
    assert result.status == gate.FAIL and "ensemble fp32 grpc @4: 0.10x" in result.detail
    assert gate.perf_gate(tmp_path / "missing.json", tmp_path, bench).status == gate.FAIL


def test_write_baseline_keeps_reference_and_tolerance(tmp_path: Path) -> None:
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps({**BASELINE, "bench_args": ["--repeats", "1"]}))
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(report({f"{REFERENCE} @4": 10.0, "ensemble fp32 grpc @4": 25.0})))
    assert gate.main(["--baseline", str(baseline), "--write-baseline", str(bench)]) == 0
    written = json.loads(baseline.read_text())
    assert written["ratios"] == {"ensemble fp32 grpc @4": 2.5}
    assert written["bench_args"] == ["--repeats", "1"] and written["tolerance"] == 0.25


def test_committed_baseline_is_usable() -> None:
    baseline = gate.load_json(gate.BASELINE, "baseline")
    assert baseline["ratios"] and 0 < baseline["tolerance"] < 1
    assert all(" @" in cell for cell in baseline["ratios"])
    assert "--reports-dir" not in baseline["bench_args"]  # the gate chooses it


def test_hardware_gate_skips_without_a_gpu_and_says_why(tmp_path: Path) -> None:
    result = gate.hardware_gate(tmp_path, detect=lambda: ([], "no CUDA provider"))
    assert result.status == gate.SKIP and "no CUDA provider" in result.detail
    failed = gate.hardware_gate(tmp_path, detect=lambda: (["CUDA"], ""), check=lambda argv: 1)
    assert failed.status == gate.FAIL
    passed = gate.hardware_gate(tmp_path, detect=lambda: (["CUDA"], ""), check=lambda argv: 0)
    assert passed.status == gate.PASS


def test_this_host_without_a_gpu_skips_the_hardware_gate() -> None:
    providers, why = gate.gpu_providers()
    if providers:
        pytest.skip(reason=f"this host has GPU providers {providers}")
    assert why


def test_summary_names_the_failed_gates() -> None:
    code, text = gate.summary(
        [
            gate.GateResult("model consistency", gate.PASS, "ok"),
            gate.GateResult("hardware", gate.SKIP, "skipped: no GPU"),
            gate.GateResult("performance baseline", gate.FAIL, "bls fp32 grpc @4: 0.5x"),
        ]
    )
    assert code == 1 and text.splitlines()[-1] == "gates failed: performance baseline"
    assert gate.summary([gate.GateResult("hardware", gate.SKIP, "")])[0] == 0
