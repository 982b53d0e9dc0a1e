"""The embedding peer section of ``make bench`` (``embed_infinity``) runs without Infinity
installed and reports ours, served from ``tritonforge serve`` in a process of its own (a tiny
run; no timed assertion: the ratios are the bench's to print, never asserted here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PIPELINE_REPOSITORY, PROJECT_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_without_infinity_the_section_reports_ours_from_a_serve_process(tmp_path: Path) -> None:
    out = tmp_path / "infinity.json"
    done = subprocess.run(
        [
            sys.executable, "-m", "tritonforge.loadtest.bench.embed_infinity",
            "--model-repository", str(PIPELINE_REPOSITORY), "--build-dir", str(tmp_path),
            "--out", str(out), "--rounds", "1", "--requests", "6", "--concurrency", "1", "2",
        ],
        capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "Infinity is not installed" in done.stdout + done.stderr
    data = json.loads(out.read_text())
    assert [(c["concurrency"], c["requests"]) for c in data["rounds"]] == [(1, 6), (2, 6)]
    assert all(c["texts_s"] > 0 for c in data["cells"]) and data["agreement"] is None
    # served by a process of its own, with the admin key it was given (the client reads configs)
    serve_log = (tmp_path / "bench_infinity_serve.log").read_text()
    assert "==> ready:" in serve_log and "TRITONFORGE_ADMIN_KEY (set)" in serve_log, serve_log
