"""The generation side-by-side section of ``make bench`` runs and reports (a tiny run; no
timed assertion: the targets are reported by the bench, never asserted here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import PIPELINE_REPOSITORY, PROJECT_ROOT
from tritonforge.headers import ADMIN_HEADER
from tritonforge.loadtest.anchors import llamacpp
from tritonforge.loadtest.bench.serve_process import ServeError, start_serve
from tritonforge.pipelines import generator_from_repository

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TINY = ["--concurrency", "1", "2", "--max-tokens", "4", "--single-requests", "2", "--rounds", "1"]


def bench(tmp_path: Path, build_dir: Path, *extra: str) -> tuple[dict[str, Any], str]:
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [
            sys.executable, "-m", "tritonforge.loadtest.bench.generate_llamacpp",
            "--model-repository", str(PIPELINE_REPOSITORY), "--build-dir", str(build_dir),
            "--out", str(out), *TINY, *extra,
        ],
        capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert out.with_suffix(".png").is_file()
    return json.loads(out.read_text()), done.stdout


def test_without_llamacpp_the_section_says_so_and_reports_ours(tmp_path: Path) -> None:
    data, stdout = bench(tmp_path, tmp_path / "empty-build")
    assert not data["llamacpp_built"]
    assert any("llama.cpp: not built" in n for n in data["notes"]), data["notes"]
    assert "llama.cpp: not built" in stdout
    cells = {(c["target"], c["concurrency"]) for c in data["cells"]}
    assert {("triton fp32", 1), ("triton fp32", 2)} <= cells
    # each variant's step timed alone (the goals' causes) at every concurrency of the run
    for times in data["steps"].values():
        assert set(times["decode_ms"]) == {"1", "2"} and times["tail_ms"] > 0
    assert not [t for t, _ in cells if t.startswith("llama.cpp")]
    fp32 = data["quality"]["triton fp32"]
    assert fp32["agreement"] == 1.0 and fp32["identical"] == "2/2"  # the reference itself
    assert fp32["tokens_per_request"] == 4 and data["same_token_counts"]
    assert fp32["perplexity"] > 1  # from the export report's gate
    assert data["goals"] and all(g["met"] is None for g in data["goals"])
    assert "n/a" in stdout and "MISS" not in stdout


@pytest.mark.skipif(
    not llamacpp.Layout(PROJECT_ROOT / "build").built(),
    reason="llama.cpp is not built under build/ (make llamacpp)",
)
def test_with_llamacpp_every_goal_gets_a_ratio(tmp_path: Path) -> None:
    data, stdout = bench(tmp_path, PROJECT_ROOT / "build", "--no-genai")
    assert data["llamacpp_built"]
    cells = {(c["target"], c["concurrency"]): c for c in data["cells"]}
    for quant in llamacpp.QUANTS:
        for conc in (1, 2):
            c = cells[f"llama.cpp {quant}", conc]
            assert c["failures"] == 0 and c["tokens_per_s"] > 0
        # greedy, EOS ignored: exactly the requested tokens
        assert data["quality"][f"llama.cpp {quant}"]["tokens_per_request"] == 4
    goals = [g for g in data["goals"] if "single-stream" in g["target"]]
    assert goals and all(g["ratio"] is not None and g["met"] in (True, False) for g in goals)
    assert "MET " in stdout or "MISS" in stdout


def test_our_server_runs_in_a_process_of_its_own_and_a_failed_start_says_why(
    tmp_path: Path,
) -> None:
    """The bench serves our decoders from ``tritonforge serve`` (not inside the bench's process,
    whose client threads would share the front's interpreter lock); a server that cannot start
    is a :class:`ServeError` carrying its log's tail, and leaves no process behind."""
    model = generator_from_repository(PIPELINE_REPOSITORY).model()
    served = start_serve(PIPELINE_REPOSITORY, [model], tmp_path / "serve.log")
    server = served.process
    try:
        assert server.proc is not None and server.proc.pid != os.getpid()
        assert served.grpc_url.startswith("127.0.0.1:") and served.http_url != served.grpc_url
        # returned once ready: the model answers on the gRPC address it gave
        with grpcclient.InferenceServerClient(served.grpc_url) as client:
            assert client.is_model_ready(model)
        # the admin key it was given opens the restricted model-config API, no other key does
        with httpclient.InferenceServerClient(served.http_url) as http:
            config = http.get_model_config(model, headers={ADMIN_HEADER: served.admin_key})
            assert config["name"] == model
            with pytest.raises(InferenceServerException):
                http.get_model_config(model, headers={ADMIN_HEADER: "not-the-key"})
    finally:
        server.stop()
    assert server.proc is None
    with pytest.raises(ServeError, match=r"(?s)tritonforge serve exited.*failed to load"):
        start_serve(PIPELINE_REPOSITORY, ["no_such_model"], tmp_path / "bad.log", 120)
