"""A locustfile's Locust run ends by itself: the rerank users (gRPC clients under gevent) against
a server that never answers. Before :mod:`tritonforge.loadtest.locust.gevent_glue` the process
deadlocked in the interpreter's teardown (a gRPC channel closed by a finalizer under gevent) and
a 4 s run hung for minutes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tritonforge.loadtest.anchors.local_server import free_port
from tritonforge.tasks.rerank import loadtest


def test_a_run_against_a_silent_server_exits_with_its_report(tmp_path: Path) -> None:
    command = [
        *(sys.executable, "-m", "locust", "-f", str(loadtest.LOCUSTFILE), "--headless"),
        *("-u", "2", "-r", "2", "-t", "2s", "--host", f"http://127.0.0.1:{free_port()}"),
        *("--grpc-url", f"127.0.0.1:{free_port()}", "--csv", str(tmp_path / "run")),
        *loadtest.USERS["both"],
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the 2 s Locust run did not exit within 120 s: {e.stderr!r}") from e
    assert "--run-time limit reached" in done.stderr, done.stderr[-2000:]
    assert (tmp_path / "run_stats.csv").is_file()
