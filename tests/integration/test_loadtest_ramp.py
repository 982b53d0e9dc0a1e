"""A short real ramp (Locust) past a tiny BLS queue: per-second rows, degradation off and on,
the same ramp through the client with its breaker, and the ramp's gate as its exit code. The
60 s 3x peak is ``make ramp``; no assertion here depends on how fast the machine is."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_degrade import degrading_repository
from tritonforge.loadtest.reliability.ramp import OUTCOMES, RampPlan, gate, locust_ramp
from tritonforge.loadtest.reliability.ramp import main as ramp_main
from tritonforge.runtime.launcher.settings import ServerSettings
from tritonforge.runtime.serving import EmbeddedServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PLAN = RampPlan(base_users=2, peak_users=16, ramp_s=2.0, peak_s=5.0)
# 16 texts a request, 16 requests a second: several times what fp32 answers here
EXTRA = ("--texts-per-request", "16", "--request-timeout-s", "30")


@pytest.fixture(scope="module")
def tiny_queue_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    """The BLS with a 2-request queue; degradation declared off, any back-to-back execute
    counts as overloaded (so a request that opts in is degraded as soon as a queue forms)."""
    repo = degrading_repository(
        tmp_path_factory.mktemp("ramp") / "repo", degrade_max_queue_delay_ms="1"
    )
    config = (repo / "embed_bls" / "config.pbtxt").read_text()
    assert "max_queue_size: 32" in config
    (repo / "embed_bls" / "config.pbtxt").write_text(
        config.replace("max_queue_size: 32", "max_queue_size: 2")
    )
    with EmbeddedServer(ServerSettings.ephemeral(repo)) as server:
        yield server


def ramp(server: EmbeddedServer, tmp_path: Path, user: str, fallback: str) -> dict[str, object]:
    return locust_ramp(
        f"http://{server.http_url}",
        user,
        PLAN,
        tmp_path / f"{user}-{fallback}.json",
        fallback=fallback,
        slo_p99_ms=60_000.0,
        extra=EXTRA,
    )


def test_ramp_reports_per_second_and_only_opted_in_requests_degrade(
    tiny_queue_server: EmbeddedServer, tmp_path: Path
) -> None:
    off = ramp(tiny_queue_server, tmp_path, "RampHttpUser", "none")
    on = ramp(tiny_queue_server, tmp_path, "RampHttpUser", "int8")
    for result in (off, on):
        seconds = result["seconds"]
        assert isinstance(seconds, list) and len(seconds) >= PLAN.duration_s - 2, seconds
        assert all(set(OUTCOMES) | {"second", "p99_ms"} == set(row) for row in seconds)
        summary = result["report"]
        assert isinstance(summary, dict) and summary["failed"] == 0, summary
        assert summary["answered_fp32"] + summary["answered_int8"] > 0, summary
    off_report, on_report = off["report"], on["report"]
    assert isinstance(off_report, dict) and isinstance(on_report, dict)
    assert off_report["refused"] > 0, off_report  # the tiny queue does overflow
    assert off_report["answered_int8"] == 0, off_report  # off: today's behaviour
    assert on_report["answered_int8"] > 0, on_report


def test_ramp_through_the_client_with_its_breaker(
    tiny_queue_server: EmbeddedServer, tmp_path: Path
) -> None:
    result = ramp(tiny_queue_server, tmp_path, "RampClientUser", "none")
    summary = result["report"]
    assert isinstance(summary, dict) and summary["requests"] > 0, summary
    assert summary["answered_fp32"] > 0 and summary["failed"] == 0, summary


def test_the_ramp_runs_both_ways_and_exits_non_zero_when_its_gate_is_breached(
    tiny_queue_server: EmbeddedServer, tmp_path: Path
) -> None:
    """``python -m tritonforge.loadtest.reliability.ramp`` end to end with a tiny plan (the saturation rate
    given, so no measuring run): off, on and the client ramp are reported, the gate's verdict is
    in the JSON, and an SLO no answer can meet breaches it (exit code 1, the p99 named)."""
    out = tmp_path / "ramp.json"
    rate = PLAN.peak_users / 4
    argv = [
        "--host", f"http://{tiny_queue_server.http_url}",
        "--saturation-rps", str(rate), "--peak-factor", "4",
        "--ramp-s", str(PLAN.ramp_s), "--peak-s", str(PLAN.peak_s),
        "--slo-p99-ms", "0.001", "--out", str(out), "--", *EXTRA,
    ]  # fmt: skip
    assert ramp_main(argv) == 1
    results = json.loads(out.read_text())
    assert results["plan"]["peak_users"] == PLAN.peak_users
    for name in ("degrade_off", "degrade_on", "client_breaker"):
        assert results[name]["seconds"] and results[name]["report"]["requests"] > 0, name
    assert results["degrade_on"]["report"]["answered_int8"] > 0
    verdict = results["gate"]
    assert verdict == {"passed": False, "breaches": gate(results)}
    assert any("p99" in b and "SLO gate 0.001 ms" in b for b in verdict["breaches"]), verdict
    assert not any("off answered" in b for b in verdict["breaches"]), verdict  # off: today's
