"""The chaos run's arithmetic and gates (the run itself: `make chaos`, and a short one in
tests/integration/test_chaos.py)."""

from __future__ import annotations

from tritonforge.loadtest.reliability.chaos.outcomes import (
    CLEAN,
    HUNG,
    LOST,
    OK,
    SHED,
    ChaosReport,
    Kill,
    Outcome,
    PipelineReport,
    back_after_s,
    gates,
    is_down,
    longest_gap_s,
    outcome_kind,
)


def test_outcome_kind_tells_hung_lost_and_clean_apart() -> None:
    assert outcome_kind("InferenceServerException: StatusCode.DEADLINE_EXCEEDED Deadline") == HUNG
    assert outcome_kind("ReadTimeout: timed out") == HUNG
    assert outcome_kind("StatusCode.UNAVAILABLE Connection reset by peer") == LOST
    assert outcome_kind("StatusCode.UNAVAILABLE Socket closed") == LOST
    assert outcome_kind("HTTP 503 Exceeds maximum queue size") == CLEAN
    assert outcome_kind("StatusCode.INTERNAL Stub process 'tokenizer_0_0' is not healthy") == CLEAN
    # the front's own answer after request_timeout_s is an answer, not a hang
    assert outcome_kind("StatusCode.UNAVAILABLE no answer from tritonserver within 60") == CLEAN
    # so are the server's queue deadlines (they contain "timeout" but are refusals with a status)
    queued = "generate: overloaded: queued longer than queue_timeout_s 10 s (16 running, 3 queued)"
    assert outcome_kind(f"StatusCode.UNAVAILABLE {queued}; retry later") == CLEAN
    assert outcome_kind("InferenceServerException: [503] Request timeout expired") == CLEAN
    assert outcome_kind("no final response within 60 s") == HUNG


def test_overload_refusals_are_not_downtime_but_crash_errors_are() -> None:
    """Chaos finding: generate "back after 95.3 s" because the refusals of the floods that came
    after the kill counted as down; a busy model is up."""
    refused = Outcome("generate", "generate", 1.0, 1.1, CLEAN, "StatusCode.UNAVAILABLE overloaded")
    assert not is_down(refused)
    queued = "generate: overloaded: queued longer than queue_timeout_s 10 s; retry later"
    assert not is_down(Outcome("generate", "generate", 1.0, 1.1, CLEAN, queued))
    ended = "generate is unavailable: its stub crashed and is reloading; retry: stream ended"
    assert is_down(Outcome("generate", "generate", 1.0, 1.1, CLEAN, ended))
    assert is_down(Outcome("generate", "generate", 1.0, 1.1, CLEAN, "has no available versions"))
    assert is_down(Outcome("generate", "generate", 1.0, 1.1, LOST, "reset"))
    kill = Kill(10.0, "generate_0_0", "generate", ["generate"], ["generate"])
    outcomes = [
        Outcome("generate", "generate", 10.1, 10.2, CLEAN, ended),
        Outcome("generate", "generate", 14.0, 14.5, OK),  # back after 4.5 s
        Outcome("generate", "generate", 30.0, 40.0, CLEAN, queued),  # a later flood
        Outcome("generate", "generate", 41.0, 41.5, OK),
    ]
    assert back_after_s(kill, outcomes, until_s=60.0) == 4.5
    assert longest_gap_s(outcomes) == 4.4


def _o(model: str, start: float, end: float, kind: str) -> Outcome:
    return Outcome("embed", model, start, end, kind)


def test_longest_gap_runs_from_the_first_failure_to_the_next_ok() -> None:
    outcomes = [
        _o("m", 0.0, 0.1, OK),
        _o("m", 1.0, 1.1, CLEAN),
        _o("m", 2.0, 2.1, LOST),
        _o("m", 4.0, 4.5, OK),
        _o("m", 5.0, 5.1, SHED),  # a refusal under a flood is not downtime
        _o("m", 6.0, 6.1, OK),
    ]
    assert longest_gap_s(outcomes) == 3.5
    assert longest_gap_s([_o("m", 0.0, 0.1, OK), _o("m", 1.0, 3.0, HUNG)]) == 2.0


def test_back_after_is_the_first_ok_after_the_last_failure_of_every_dependent() -> None:
    kill = Kill(10.0, "tokenizer_0_0", "tokenizer", ["embed"], ["embed", "embed_bls"])
    outcomes = [
        _o("embed", 9.0, 10.5, OK),  # started before the kill
        _o("embed", 10.2, 10.3, CLEAN),
        _o("embed", 12.0, 12.2, OK),
        _o("embed_bls", 10.4, 10.5, CLEAN),
        _o("embed_bls", 11.0, 11.1, CLEAN),
        _o("embed_bls", 13.0, 14.0, OK),
    ]
    assert back_after_s(kill, outcomes, until_s=60.0) == 4.0
    assert back_after_s(kill, outcomes[:5], until_s=60.0) is None  # embed_bls never came back
    assert back_after_s(kill, [_o("embed", 11.0, 11.1, OK)], until_s=60.0) == 0.0


def test_gates() -> None:
    report = ChaosReport(duration_s=60, rate_per_s=10)
    report.pipelines = {
        "embed": PipelineReport(sent=1000, ok=990, clean_error=10, stub_killed=True),
        "classify": PipelineReport(sent=1000, ok=1000),
        "generate": PipelineReport(sent=100, ok=50, shed=40, clean_error=10, flooded=True),
    }
    report.kills = [Kill(1.0, "tokenizer_0_0", "tokenizer", ["embed"], ["embed"], 3.0)]
    assert gates(report, 0.999, 10.0) == []
    report.pipelines["classify"] = PipelineReport(sent=1000, ok=998, clean_error=1, lost=1)
    report.kills[0].back_after_s = 11.0
    report.server_restarts = 1
    report.faults = {"flood": {OK: 95, HUNG: 1}}
    breaches = gates(report, 0.999, 10.0)
    assert len(breaches) == 5, breaches
    assert any("classify: 1 lost" in b for b in breaches)
    assert any("99.8000% of requests OK" in b for b in breaches)
    assert any("after 11.0 s" in b for b in breaches)
    assert any("flood" in b for b in breaches)
    assert any("whole-server restarts" in b for b in breaches)
