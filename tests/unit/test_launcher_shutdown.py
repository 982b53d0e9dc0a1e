"""The launcher's shutdown order and exit status (issue #19 finding 5), with a stand-in for the
server: the supervisor stops first, then the front drains, then tritonserver stops; an exit
status other than 0 from tritonserver makes the launcher exit 1 (it used to exit 0)."""

from __future__ import annotations

import threading

import pytest

from tritonforge.runtime.cli import main as cli


class Supervisor:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def stop(self) -> None:
        self.calls.append("supervisor.stop")


class Endpoint:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls
        self.draining = threading.Event()
        self.supervisor = Supervisor(calls)

    def stop(self) -> None:
        self.calls.append("endpoint.stop")


class Server:
    def __init__(self, calls: list[str], code: int | None) -> None:
        self.calls, self.code = calls, code
        self.returncode: int | None = None
        self.restarting = False

    def drain_front(self, timeout_s: float) -> bool:
        self.calls.append(f"drain_front({timeout_s:g})")
        return True

    def stop(self) -> int | None:
        self.calls.append("server.stop")
        return self.code

    def leftover_processes(self) -> list[int]:
        return []


@pytest.mark.parametrize(("code", "expected"), [(0, 0), (1, 1), (-9, 1)])
def test_shutdown_order_and_exit_status(code: int, expected: int) -> None:
    calls: list[str] = []
    stop = threading.Event()
    stop.set()
    endpoint = Endpoint(calls)
    result = cli._wait_for_signal(Server(calls, code), stop, endpoint, drain_timeout_s=5)  # type: ignore[arg-type]
    assert result == expected
    assert calls == ["supervisor.stop", "drain_front(5)", "server.stop", "endpoint.stop"]
    assert endpoint.draining.is_set()
