"""The generate model's worst days on the real embedded Triton: its stub killed mid-stream
(every open stream ends with an error, none hangs, the supervisor restores the model), and
SIGTERM with streams open (they finish or end with an error before the server exits)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.integration.reliability import linked_repository
from tritonforge.client.errors import ClientError
from tritonforge.client.generate import GenerateClient
from tritonforge.runtime.launcher.settings import ServerSettings
from tritonforge.runtime.serving import EmbeddedServer
from tritonforge.runtime.supervisor.supervisor import RELOAD_TIMEOUT_S, Supervisor

pytestmark = pytest.mark.integration
LONG = "Write a long story about a dragon and a knight."
STREAM_TIMEOUT_S = 20.0


class Streams:
    """``n`` concurrent gRPC streams; records each one's chunks and how it ended."""

    def __init__(self, url: str, n: int, max_tokens: int) -> None:
        self.url, self.max_tokens = url, max_tokens
        self.chunks = [0] * n
        self.ended: list[object] = [None] * n
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(n)]
        for t in self.threads:
            t.start()

    def _run(self, i: int) -> None:
        c = GenerateClient(self.url, protocol="grpc", timeout_s=STREAM_TIMEOUT_S)
        try:
            for chunk in c.stream(f"{LONG} ({i})", max_tokens=self.max_tokens):
                self.chunks[i] += 1
                if chunk.finish_reason is not None:
                    self.ended[i] = chunk.finish_reason
        except ClientError as e:
            self.ended[i] = e

    def wait_started(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while min(self.chunks) < 2:
            assert time.monotonic() < deadline, f"streams did not start: {self.chunks}"
            time.sleep(0.05)

    def join(self, timeout_s: float) -> None:
        for t in self.threads:
            t.join(timeout=timeout_s)
        assert not any(t.is_alive() for t in self.threads), "a client stream hung"


def _server(repo: Path, **kwargs: object) -> EmbeddedServer:
    server = EmbeddedServer(ServerSettings.ephemeral(repo, **kwargs))
    server.start().wait_ready()
    return server


def test_killed_stub_ends_every_open_stream_and_the_supervisor_restores_it(
    tmp_path: Path,
) -> None:
    server = _server(
        linked_repository(tmp_path / "repo", ("generate",)), model_control_mode="explicit"
    )
    supervisor = Supervisor(server, ["generate"], canary_interval_s=1.0, poll_interval_s=0.2)
    try:
        supervisor.start()
        streams = Streams(server.grpc_url, 3, max_tokens=400)
        streams.wait_started()
        victim = server.stub_pids()["generate_0_0"]
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        streams.join(STREAM_TIMEOUT_S + 30)
        print(
            "stream ends after the kill:", [f"{type(e).__name__}: {e}"[:160] for e in streams.ended]
        )
        assert all(isinstance(e, ClientError) for e in streams.ended), streams.ended
        # ended by the supervisor with the reason (A6), not by the client's timeout: Triton
        # never sends the final response of a dead decoupled stub's requests
        assert all("its stub crashed" in str(e) for e in streams.ended), streams.ended
        # the supervisor's own bound on the reload, then a canary round: a shorter wait (90 s
        # was) fails a reload that is slow on a busy host but within the supervisor's bound
        budget_s = RELOAD_TIMEOUT_S + 30
        recovered = False
        while time.monotonic() - killed_at < budget_s and not recovered:
            health = supervisor.health()
            recovered = health.healthy and health.restarts >= 1
            time.sleep(0.2)
        print("recovery:", supervisor.health().last_restart_reason)
        assert recovered, (
            f"not restored within {budget_s:g} s: {supervisor.health()}\n"
            f"tritonserver's log:\n{server.log_text(40)}"
        )
        assert server.stub_pids()["generate_0_0"] != victim
        c = GenerateClient(server.grpc_url, protocol="grpc", timeout_s=60)
        assert c.generate("Hi", stream=False, max_tokens=2)
    finally:
        supervisor.stop()
        server.stop()


def test_sigterm_finishes_or_errors_every_open_stream_before_exit(tmp_path: Path) -> None:
    server = _server(linked_repository(tmp_path / "repo", ("generate",)), exit_timeout_s=20.0)
    try:
        streams = Streams(server.grpc_url, 2, max_tokens=24)
        streams.wait_started()
        stopped = threading.Thread(target=server.stop)
        stopped.start()  # SIGTERM, then wait for a graceful exit
        streams.join(STREAM_TIMEOUT_S + 40)
        stopped.join(timeout=60)
        assert not stopped.is_alive(), "the server did not exit"
        for end in streams.ended:
            assert end in ("length", "stop") or isinstance(end, ClientError), streams.ended
        assert any(end in ("length", "stop") for end in streams.ended), streams.ended  # drained
    finally:
        server.stop()
