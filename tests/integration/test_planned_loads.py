"""Issue #36 item 3, on the real embedded Triton: a planned load is not a crash.

``make run`` loads each pipeline as its background export completes, and reloads the models an
export rewrote: Triton retires the old instances, whose stubs exit. The supervisor read that as
"stub process of embed_bls_0_0, embed_bls_0_1 died" and reloaded everything again. Here the
loads go through :meth:`EmbeddedServer.load_model` (what the staged exports call) while the
supervisor watches: nothing is recovered, and a stub killed afterwards still is. On this CPU host
every ensemble load also made Triton log an E-level "unable to create stream ... CUDA driver":
the launcher's log shows one note instead and no E-level line.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.reliability import linked_repository
from tritonforge.runtime.launcher.logparse import NO_CUDA_NOTE
from tritonforge.runtime.launcher.settings import ServerSettings
from tritonforge.runtime.serving import EmbeddedServer
from tritonforge.runtime.supervisor.supervisor import Supervisor

pytestmark = pytest.mark.integration

MODELS = (
    "tokenizer", "encoder_fp32", "encoder_int8", "encoder_torchscript", "fused_fp32", "embed",
    "embed_bls",
)  # fmt: skip


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.1)


def test_staged_reloads_recover_nothing_and_a_later_crash_still_recovers(
    tmp_path: Path,
) -> None:
    repo = linked_repository(tmp_path / "repo", MODELS)
    server = EmbeddedServer(ServerSettings.ephemeral(repo, model_control_mode="explicit"))
    server.start().wait_ready()
    recoveries: list[str] = []
    supervisor = Supervisor(
        server, ["embed_bls"], canary_interval_s=60.0, poll_interval_s=0.05,
        on_restart=recoveries.append,
    )  # fmt: skip
    try:
        supervisor.start()
        before = server.stub_pids()
        for model in ("embed_bls", "embed", "embed_bls"):  # as the staged exports load them
            server.load_model(model, force=model == "embed_bls")
            time.sleep(1.0)  # several liveness polls while the old stubs exit
        after = server.stub_pids()
        assert before["embed_bls_0_0"] != after["embed_bls_0_0"]  # the stubs were replaced
        assert recoveries == [] and supervisor.health().model_reloads == 0, recoveries
        os.kill(after["embed_bls_0_0"], signal.SIGSEGV)  # a real crash is still one
        _wait(lambda: supervisor.health().model_reloads == 1, 60, "embed_bls reloaded")
        assert "embed_bls_0_0" in recoveries[0], recoveries
        log = server.log_text()
        assert [line for line in log.splitlines() if line.startswith("E")] == [], log
        assert log.count(NO_CUDA_NOTE) == 1, log
    finally:
        supervisor.stop()
        server.stop()
