"""``wait_ready`` behind the metrics proxy: Triton answers ready before its own metrics listener is
up, and until it is the proxy answers 503; readiness must wait for both (a CI flake of
``test_finding8_the_metrics_port_is_held_while_tritonserver_restarts``)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tritonforge.runtime.errors import ServerStartError
from tritonforge.runtime.launcher import metrics
from tritonforge.runtime.launcher.server import TritonLauncher
from tritonforge.runtime.launcher.settings import ServerSettings


class _ReadyTriton(TritonLauncher):
    """A launcher whose Triton answers ready at once (no process is started)."""

    def is_ready(self, timeout_s: float = 2.0) -> bool:
        return True


def _launcher(tmp_path: Path, metrics_port: int | None) -> TritonLauncher:
    launcher = _ReadyTriton(ServerSettings.ephemeral(tmp_path))
    launcher._triton_metrics_port = metrics_port
    return launcher


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_ready_waits_for_tritons_metrics_listener(tmp_path: Path) -> None:
    launcher = _launcher(tmp_path, _closed_port())
    with pytest.raises(ServerStartError, match="not ready"):
        launcher.wait_ready(timeout_s=0.5)


def test_ready_once_the_metrics_listener_accepts(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        launcher = _launcher(tmp_path, int(listener.getsockname()[1]))
        assert launcher.wait_ready(timeout_s=5) is launcher
    launcher.stop()


def test_without_the_proxy_readiness_alone_decides(tmp_path: Path) -> None:
    launcher = _launcher(tmp_path, None)
    assert launcher.wait_ready(timeout_s=5) is launcher
    launcher.stop()


def test_accepts_connections() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        assert metrics.accepts_connections("127.0.0.1", int(listener.getsockname()[1]))
    assert not metrics.accepts_connections("127.0.0.1", _closed_port())
