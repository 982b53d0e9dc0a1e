"""A short chaos run in the suite (``make chaos`` is the long one; 60 s here): mixed traffic over every
pipeline while the injector SIGSEGVs stubs, floods generate past its
queue, opens SSE streams, cancels streams and sends malformed headers. Every gate must hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import PIPELINE_REPOSITORY
from tests.integration.reliability import linked_repository
from tritonforge.loadtest.reliability.chaos.injector import FAULTS, run_chaos
from tritonforge.loadtest.reliability.chaos.outcomes import print_report
from tritonforge.pipelines import from_repository
from tritonforge.repository import model_names

pytestmark = pytest.mark.integration


def test_chaos_run_keeps_every_gate(tmp_path: Path) -> None:
    if not from_repository(PIPELINE_REPOSITORY):
        pytest.skip(reason="no pipeline exported: run `make export`")
    repo = linked_repository(tmp_path / "repo", tuple(model_names(PIPELINE_REPOSITORY)))
    # One round of every fault, 2 s apart (a stub kill first), then 48 s without faults: each
    # kill's recovery is measured. `make chaos` gates recovery at 10 s; on 2 shared, busy cores
    # a TorchScript encoder's reload alone took 9-19 s at load 6 and 35 s at load 15, and a
    # test must not fail only because the machine is busy: here the gate is "back at all
    # within the run", every other gate is the 10-minute run's.
    report = run_chaos(
        repo, duration_s=60.0, rate_per_s=6.0, seed=19, faults=FAULTS, fault_interval_s=2.0,
        timeout_s=60.0, sse_streams=16, max_recovery_s=55.0, cooldown_s=48.0,
    )  # fmt: skip
    print_report(report)
    assert report.kills, "the injector killed no stub"
    assert sum(p.sent for p in report.pipelines.values()) > 100
    assert not report.breaches, report.breaches
