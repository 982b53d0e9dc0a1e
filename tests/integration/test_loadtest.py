"""Short real Locust runs against the real embedded Triton: the SLO gate passes and fails."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT
from tritonforge.runtime.server import EmbeddedServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def loadtest(server: EmbeddedServer, reports: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable, "-m", "tritonforge.loadtest.run",
            "--url", server.http_url, "--grpc-url", server.grpc_url,
            "--reports-dir", str(reports), "--users", "2", "--duration-s", "8", *args,
        ],
        capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=180, check=False,
    )  # fmt: skip


def test_short_run_passes_the_default_slos(pipeline_server: EmbeddedServer, tmp_path: Path) -> None:
    done = loadtest(pipeline_server, tmp_path)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "SLO OK" in log
    with (tmp_path / "loadtest_stats.csv").open() as f:
        rows = {row["Name"]: row for row in csv.DictReader(f)}
    # both protocols sent traffic and nothing failed validation
    assert int(rows["http embed"]["Request Count"]) > 0
    assert int(rows["grpc embed"]["Request Count"]) > 0
    assert int(rows["Aggregated"]["Failure Count"]) == 0
    assert (tmp_path / "loadtest.html").stat().st_size > 0


def test_impossible_thresholds_fail_with_exit_1_naming_each(
    pipeline_server: EmbeddedServer, tmp_path: Path
) -> None:
    done = loadtest(
        pipeline_server, tmp_path, "--protocol", "grpc", "--pipeline", "bls", "--variant", "int8",
        "--slo-p95-ms", "0.001", "--slo-min-rps", "1000000",
    )  # fmt: skip
    log = done.stdout + done.stderr
    assert done.returncode == 1, log[-4000:]
    breach = next(line for line in log.splitlines() if "SLO BREACHED" in line)
    assert "p95_ms" in breach and "min_rps" in breach
    assert "p99_ms" not in breach and "max_fail_ratio" not in breach
    with (tmp_path / "loadtest_stats.csv").open() as f:
        names = {row["Name"] for row in csv.DictReader(f)}
    assert "grpc embed_bls[int8]" in names


def test_bench_smoke_writes_rows_with_ratios(
    pipeline_server: EmbeddedServer, tmp_path: Path
) -> None:
    done = subprocess.run(
        [
            sys.executable, "-m", "tritonforge.loadtest.bench", "--url", pipeline_server.http_url,
            "--grpc-url", pipeline_server.grpc_url, "--reports-dir", str(tmp_path),
            "--duration-s", "3", "--warmup-s", "1", "--inprocess-s", "1", "--concurrency", "1",
            "--pipelines", "ensemble", "--variants", "fp32", "--protocols", "grpc",
            "--skip-fastapi", "--repeats", "2",
        ],
        capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    (report,) = tmp_path.glob("bench-*.json")
    data = json.loads(report.read_text())
    (row,) = data["cells"]
    assert row["label"] == "ensemble fp32 grpc" and row["requests"] > 0 and row["failures"] == 0
    assert row["repeats"] == 2 and len(data["rounds"]["cells"]) == 2
    assert row["x_inprocess_throughput"] > 0 and row["x_inprocess_p50"] > 0
    assert {r["batch"] for r in data["inprocess"]} == {1, 16}
    assert list(tmp_path.glob("bench-*.png"))
    assert "thr/inproc16" in done.stdout
