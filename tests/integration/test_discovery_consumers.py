"""Consumers that discover the pipelines (no model named in them) against the real embedded
Triton serving the bring-your-own repository (``distil`` embeddings + ``sentiment`` classifier,
conftest.py): a classification load test with its SLO gate and the container's liveness canary."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT
from tritonforge.runtime.launcher.settings import free_port
from tritonforge.runtime.serving import EmbeddedServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_classification_load_test_discovers_the_pipeline_and_gates_slos(
    byo_server: EmbeddedServer, tmp_path: Path
) -> None:
    env = {**os.environ, "TRITONFORGE_ADMIN_KEY": byo_server.settings.admin_key}
    env.pop("TRITONFORGE_MODEL_REPOSITORY", None)
    done = subprocess.run(
        [
            sys.executable, "-m", "tritonforge.loadtest.locust.run", "--task", "classification",
            "--url", byo_server.http_url, "--grpc-url", byo_server.grpc_url,
            "--reports-dir", str(tmp_path), "--users", "2", "--duration-s", "6",
            "--texts-per-request", "3",
        ],
        capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=180, check=False, env=env,
    )  # fmt: skip
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "SLO OK" in log
    with (tmp_path / "loadtest_stats.csv").open() as f:
        rows = {row["Name"]: row for row in csv.DictReader(f)}
    assert int(rows["http sentiment"]["Request Count"]) > 0  # discovered: the only classifier
    assert int(rows["grpc sentiment"]["Request Count"]) > 0
    assert int(rows["Aggregated"]["Failure Count"]) == 0  # every answer validated


def test_an_unknown_variant_fails_the_run_naming_it(
    byo_server: EmbeddedServer, byo_repository: Path, tmp_path: Path
) -> None:
    done = subprocess.run(
        [
            sys.executable, "-m", "tritonforge.loadtest.locust.run", "--task", "classification",
            "--url", byo_server.http_url, "--grpc-url", byo_server.grpc_url,
            "--reports-dir", str(tmp_path), "--users", "1", "--duration-s", "2",
            "--protocol", "http", "--variant", "int8", "--model-repository", str(byo_repository),
        ],
        capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=120, check=False,
        env={**os.environ, "TRITONFORGE_MODEL_REPOSITORY": str(byo_repository)},
    )  # fmt: skip
    assert done.returncode != 0
    assert "unknown variant='int8'" in done.stdout + done.stderr


def test_the_liveness_canary_calls_every_discovered_pipeline(
    byo_server: EmbeddedServer, byo_repository: Path
) -> None:
    def canary(url: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tritonforge.canary", "--repository", str(byo_repository),
             "--url", url, "--timeout-s", "30"],
            capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=120, check=False,
        )  # fmt: skip

    ok = canary(f"http://{byo_server.http_url}")
    assert ok.returncode == 0, ok.stderr
    down = canary(f"http://127.0.0.1:{free_port()}")
    assert down.returncode == 1
    for model in ("distil", "distil_bls", "sentiment", "sentiment_bls"):
        assert f"canary failed: {model}:" in down.stderr


def test_bench_measures_the_classifier_against_fastapi_predict_and_in_process(
    byo_server: EmbeddedServer,
    byo_repository: Path,
    byo_checkpoints: dict[str, tuple[Path, str]],
    tmp_path: Path,
) -> None:
    """One short round: the discovered classifier's ensemble over Locust/HTTP, the first seed's
    FastAPI /predict on the same (verified) checkpoint, and its in-process limit, with ratios."""
    import json

    env = {**os.environ, "TRITONFORGE_ADMIN_KEY": byo_server.settings.admin_key}
    done = subprocess.run(
        [
            sys.executable, "-m", "tritonforge.loadtest.bench", "--url", byo_server.http_url,
            "--grpc-url", byo_server.grpc_url, "--model-repository", str(byo_repository),
            "--classify-checkpoint", str(byo_checkpoints["sentiment"][0]),
            "--reports-dir", str(tmp_path), "--duration-s", "2", "--warmup-s", "1",
            "--inprocess-s", "1", "--concurrency", "1", "--pipelines", "ensemble",
            "--variants", "fp32", "--locust-protocols", "http", "--pa-protocols", "",
            "--repeats", "1", "--skip-embedding",
        ],
        capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=400, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    (report,) = tmp_path.glob("bench-*.json")
    data = json.loads(report.read_text())
    rows = {r["label"]: r for r in data["cells"]}
    served = rows["sentiment ensemble fp32 http/locust"]
    baseline = rows["fastapi+torch /predict sentiment"]
    for row in (served, baseline):
        assert row["status"] == "ok" and row["requests"] > 0 and row["failures"] == 0, row
    assert served["x_fastapi_throughput"] > 0 and served["x_inprocess_throughput"] > 0
    assert {(r["task"], r["name"]) for r in data["inprocess"]} == {("classification", "sentiment")}
    assert not any(r["task"] == "embedding" for r in data["cells"])  # --skip-embedding
    assert any(line.startswith("sentiment ensemble fp32") for line in data["targets"])


def test_the_predict_baseline_refuses_a_checkpoint_that_is_not_the_exported_one(
    byo_repository: Path, byo_checkpoints: dict[str, tuple[Path, str]]
) -> None:
    from tritonforge.pipelines import from_repository
    from tritonforge.tasks.classification.loadtest.bench import baseline_for

    sentiment = from_repository(byo_repository)["sentiment"]
    ok, why = baseline_for(byo_repository, sentiment, byo_checkpoints["sentiment"][0])
    assert ok is not None and ok.max_length == 64 and why == ""
    wrong, why = baseline_for(byo_repository, sentiment, byo_checkpoints["distil"][0])
    assert wrong is None and "differs from the exported one" in why
