"""Refuse early with short answers (issue #36 item 2): a request's service is its prompt's
prefill plus its decoded tokens. With ``max_tokens 16`` the prefill dominates, and a forecast
that learned its seconds per token from long answers admitted too many: its refusals came
seconds late (6.7 s on the shared host). A fake clock: no timing."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.test_generation import EOS, empty_past, make, toy_step
from tritonforge.errors import StageUnavailableError
from tritonforge.queue_forecast import (
    LATE_WINDOW_S,
    PRIOR_PROMPT_TOKEN_S,
    PRIOR_ROW_STEP_S,
    Queued,
    ServiceRate,
    late_in_queue,
    predicted_wait_s,
)
from tritonforge.scheduler import FINISH_LENGTH, Scheduler

PREFILL_TOKEN_S, STEP_S = 0.01, 0.1  # the fake decoder's costs
PROMPT = [1] * 50  # 0.5 s of prefill each


def test_a_queued_request_costs_its_prefill_and_stalls_every_slot_meanwhile() -> None:
    rate = ServiceRate(step_s={2: 0.5}, prompt_token_s=0.1)
    # slots free at 2 s and 5 s; the one queued ahead starts at 2 s, is prefilled for 1 s (10
    # prompt tokens: the other slot moves to 6 s) and decodes 8 tokens until 7 s; the next one
    # takes the slot freed at 6 s and holds it for 1 token, until 6.5 s
    assert predicted_wait_s([4, 10], [Queued(8, 10)], 2, rate) == pytest.approx(6.0)
    assert predicted_wait_s([4, 10], [Queued(8, 10), Queued(1, 0)], 2, rate) == pytest.approx(6.5)
    # a prefill under way (busy_s) delays every slot, a free one too
    assert predicted_wait_s([4], [], 2, rate, busy_s=0.7) == pytest.approx(0.7)
    assert predicted_wait_s([4, 10], [], 2, rate, busy_s=0.7) == pytest.approx(2.7)


def test_the_prior_stands_in_before_anything_is_measured() -> None:
    rate = ServiceRate()
    assert rate.token_s(16) == pytest.approx(16 * PRIOR_ROW_STEP_S)
    assert rate.prefill_s(40) == pytest.approx(40 * PRIOR_PROMPT_TOKEN_S)
    wait = predicted_wait_s([4], [Queued(8, 40)], 1, rate)
    assert wait == pytest.approx(4 * PRIOR_ROW_STEP_S + 40 * PRIOR_PROMPT_TOKEN_S + 8 * 0.025)


def test_the_prefill_cost_is_learned_per_padded_prompt_token() -> None:
    rate = ServiceRate(alpha=0.5)
    rate.observe_prefill(1.6, padded_tokens=16 * 40)
    assert rate.prompt_token_s == pytest.approx(0.0025)
    rate.observe_prefill(0.2, padded_tokens=40)
    assert rate.prompt_token_s == pytest.approx(0.00375)
    rate.observe_prefill(-1.0, padded_tokens=40)  # ignored: nothing to learn
    rate.observe_prefill(1.0, padded_tokens=0)
    assert rate.prefill_s(10) == pytest.approx(0.0375)
    rate.observe_finish(tokens=2, max_new_tokens=16)
    assert rate.used_share < 1.0
    rate.forget_share()  # after a warm-up whose prompt stops early
    assert rate.used_share == 1.0


def test_a_late_refusal_comes_within_the_window_of_its_arrival_or_never() -> None:
    rate = ServiceRate(step_s={1: 1.0}, prompt_token_s=0.0)
    # one slot, 5 tokens left: each queued one would start at 5, 8, 11 s
    fresh = [Queued(3, 0, 0.1), Queued(3, 0, 0.1), Queued(3, 0, 0.1)]
    assert late_in_queue([5], fresh, 1, rate, timeout_s=10.0) == [2]
    # the same, arrived earlier than the window: committed, kept (its deadline still holds)
    old = [Queued(3, 0, LATE_WINDOW_S), Queued(3, 0, LATE_WINDOW_S), Queued(3, 0, 3.0)]
    assert late_in_queue([5], old, 1, rate, timeout_s=10.0) == []
    # a late one refused frees its place: the fresh one behind it starts at 8 s, not 11
    mixed = [Queued(3, 0, 0.1), Queued(3, 0, 0.5), Queued(3, 0, 0.1)]
    assert late_in_queue([5], mixed, 1, rate, timeout_s=8.2) == [1]


def _costly_step(now: list[float]):  # type: ignore[no-untyped-def]
    """The toy decoder on a fake clock: a prefill costs its padded prompt tokens, a decode step
    :data:`STEP_S` whatever the batch."""

    def step(ids, mask, positions, past):  # type: ignore[no-untyped-def]
        prefill = past[0].shape[2] == 0
        now[0] += PREFILL_TOKEN_S * ids.size if prefill else STEP_S
        return toy_step(ids, mask, positions, past)

    return step


def test_short_answers_under_a_flood_are_refused_at_once_not_seconds_later() -> None:
    """4 slots, 32 queued places, ``queue_timeout_s`` 10 s; warmed up on 16-token answers as the
    engine is, then flooded with 40 requests of 4 tokens: a wave of 4 costs 2 s of prefill and
    0.3 s of decoding. Every refusal comes within 1 s of its arrival (today's forecast, blind to
    the prefill, admitted all 36 and refused 16 of them after 2.3 s or more), and every
    request admitted is served."""
    now = [0.0]
    sched = Scheduler(
        _costly_step(now), empty_past, [EOS], max_running=4, max_queue=32, name="generate",
        queue_timeout_s=10.0, clock=lambda: now[0],
    )  # fmt: skip
    for _ in range(4):  # the engine's warm-up: a full batch of 16-token answers
        sched.submit(make(PROMPT, 16))
    sched.run_until_idle()
    sched.rate.forget_share()
    t0, out, refused_s = now[0], [], []
    flood = [make(PROMPT, 4, out=out) for _ in range(40)]
    for seq in flood:
        seq.on_error = lambda s, e: refused_s.append((now[0] - t0, str(e)))
        try:
            sched.submit(seq)
        except StageUnavailableError as e:
            refused_s.append((0.0, str(e)))
    sched.run_until_idle()
    finished = [i for i, _, r in out if r == FINISH_LENGTH]
    assert len(finished) + len(refused_s) == len(flood)
    assert 12 <= len(finished) < len(flood), (len(finished), refused_s)
    late = [(round(t, 2), e[:70]) for t, e in refused_s if t > 1.0]
    assert late == [], f"{len(late)} refusals after more than 1 s: {late[:3]}"
    assert np.isclose(max(t for t, _ in refused_s), 0.0)
