"""Short real Locust runs against the real embedded Triton: the SLO gate passes and fails."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PIPELINE_REPOSITORY, PROJECT_ROOT
from tritonforge.runtime.serving import EmbeddedServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def loadtest(server: EmbeddedServer, reports: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable, "-m", "tritonforge.loadtest.locust.run",
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


def test_bench_smoke_writes_rows_with_ratios_and_reports_a_failed_generator(
    pipeline_server: EmbeddedServer, tmp_path: Path
) -> None:
    """Locust over HTTP measures; perf_analyzer is made unavailable (an empty tool dir): its cell
    is reported as failed and the table, JSON and PNG are still written (exit 0)."""
    env = {
        **os.environ,
        "TRITONFORGE_PERF_ANALYZER_DIR": str(tmp_path / "no-tool"),
        "TRITONFORGE_ADMIN_KEY": next(iter(pipeline_server.admin_headers.values())),
    }
    done = subprocess.run(
        [
            sys.executable, "-m", "tritonforge.loadtest.bench", "--url", pipeline_server.http_url,
            "--grpc-url", pipeline_server.grpc_url, "--reports-dir", str(tmp_path),
            "--duration-s", "3", "--warmup-s", "1", "--inprocess-s", "1", "--concurrency", "1",
            "--pipelines", "ensemble", "--variants", "fp32", "--locust-protocols", "http",
            "--pa-protocols", "grpc", "--skip-fastapi", "--repeats", "2", "--skip-classify",
        ],
        capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=240, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    (report,) = tmp_path.glob("bench-*.json")
    data = json.loads(report.read_text())
    rows = {r["label"]: r for r in data["cells"]}
    ok = rows["ensemble fp32 http/locust"]
    assert ok["status"] == "ok" and ok["requests"] > 0 and ok["failures"] == 0
    assert ok["repeats"] == 2 and len(data["rounds"]["cells"]) == 4
    (inproc1,) = [r for r in data["inprocess"] if r["batch"] == 1]
    assert ok["x_inprocess_throughput"] > 0
    assert ok["p50_minus_inprocess_ms"] == pytest.approx(ok["p50_ms"] - inproc1["p50_ms"])
    assert 0 < ok["generator_cpu_share"] <= 1
    assert ok["server_stats"]["fused_fp32"]["inference_count"] > 0  # per-stage breakdown
    assert math.isnan(ok["server_cpu_ms_per_request"])  # a server the bench did not start
    failed = rows["ensemble fp32 grpc/pa"]
    assert failed["status"].startswith("2/2 rounds: failed: perf_analyzer is not installed")
    assert {r["batch"] for r in data["inprocess"]} == {1, 16}
    assert list(tmp_path.glob("bench-*.png"))
    assert "thr/inproc1" in done.stdout and "Where the time goes" in done.stdout


@pytest.mark.parametrize("user_class", ["TritonHttpUser", "TritonGrpcUser"])
def test_a_server_that_never_answers_fails_requests_instead_of_stalling_the_run(
    tmp_path: Path, user_class: str
) -> None:
    """A listener that accepts and never replies (a hung server): each request fails after
    --request-timeout-s and Locust stops on time (was: users blocked past the stop timeout)."""
    import socket
    import threading
    import time

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    port = listener.getsockname()[1]
    samples = tmp_path / "samples.json"
    from tritonforge.loadtest.locust.run import locust_command
    from tritonforge.tasks.embedding.loadtest import LOCUSTFILE

    command = locust_command(
        locustfile=LOCUSTFILE,
        user_classes=[user_class],
        host=f"http://127.0.0.1:{port}",
        users=2,
        duration_s=3,
        extra=[
            "--grpc-url", f"127.0.0.1:{port}", "--request-timeout-s", "1",
            "--samples-out", str(samples), "--slo-max-fail-ratio", "1", "--slo-min-rps", "0",
            # the pipeline's names from the repository: this fake server answers nothing
            "--model-repository", str(PIPELINE_REPOSITORY),
        ],
    )  # fmt: skip
    started = time.monotonic()
    try:
        subprocess.run(
            command, capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=60, check=False
        )
    finally:
        stop.set()
        for conn in held:
            conn.close()
        listener.close()
    assert time.monotonic() - started < 30
    summary = json.loads(samples.read_text())
    assert summary["failures"] > 0 and summary["requests"] == 0  # every request timed out
