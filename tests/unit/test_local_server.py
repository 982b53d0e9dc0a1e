"""The bench anchors' shared local peer server (llama.cpp, Infinity): started on a free port,
waited on until healthy, stopped; a process that dies first is the anchor's error with its log."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tritonforge.loadtest.anchors.local_server import LocalServer, free_port, healthy


class PeerError(Exception):
    pass


def test_a_server_is_started_until_healthy_then_stopped(tmp_path: Path) -> None:
    port = free_port()
    server = LocalServer("http.server", PeerError)
    cmd = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    url = f"http://127.0.0.1:{port}/"
    server.start(cmd, tmp_path / "server.log", url, ready_timeout_s=60, poll_interval_s=0.1)
    try:
        assert server.proc is not None and server.proc.poll() is None
        assert healthy(url)
    finally:
        server.stop()
    assert server.proc is None and not healthy(url)
    server.stop()  # idempotent


def test_a_server_that_exits_first_is_the_anchors_error_with_its_log(tmp_path: Path) -> None:
    server = LocalServer("peer", PeerError)
    cmd = [sys.executable, "-c", "import sys; print('no model here'); sys.exit(3)"]
    url = f"http://127.0.0.1:{free_port()}/health"
    with pytest.raises(PeerError, match=r"peer exited 3: no model here"):
        server.start(cmd, tmp_path / "server.log", url, ready_timeout_s=60)
    assert server.proc is None


def test_a_server_on_port_0_is_waited_on_at_the_url_its_log_gives(tmp_path: Path) -> None:
    """``health_url`` as a function: None until the server's log names its port, then polled."""
    log = tmp_path / "server.log"
    server = LocalServer("http.server", PeerError)
    cmd = [sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1"]
    asked: list[str | None] = []

    def url() -> str | None:  # http.server logs "Serving HTTP on 127.0.0.1 port N (...)"
        found = re.search(r"port (\d+)", log.read_text())
        asked.append(found and f"http://127.0.0.1:{found.group(1)}/")
        return asked[-1]

    server.start(cmd, log, url, ready_timeout_s=60, poll_interval_s=0.05)
    try:
        assert asked[-1] is not None and healthy(asked[-1])
    finally:
        server.stop()
