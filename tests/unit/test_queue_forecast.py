"""Refuse early (issue #36 item 2): the generate scheduler predicts a queued request's wait from
the queue and the measured service rate, and refuses at once one that would wait past
``queue_timeout_s`` (before: it waited the 10 s out, then heard no). A fake clock: no timing."""

from __future__ import annotations

import threading

import pytest

from tests.unit.test_generation import EOS, empty_past, make, toy_step
from tritonforge.errors import InvalidInputError, StageUnavailableError
from tritonforge.generation import QUEUE_PRIORITY_PARAMETER, queue_priority
from tritonforge.queue_forecast import (
    Queued,
    ServiceRate,
    late_in_queue,
    predicted_wait_s,
    retry_after_s,
    retry_hint,
)
from tritonforge.scheduler import FINISH_LENGTH, Scheduler
from tritonforge.stream_errors import says_unavailable


def test_the_wait_simulates_the_slots_running_and_queued() -> None:
    rate = ServiceRate(step_s={2: 0.5}, prompt_token_s=0.0)  # no prompt cost here
    # two slots free after 2 s and 5 s; the one queued ahead takes the first until 6 s
    assert predicted_wait_s([4, 10], [Queued(8)], 2, rate) == pytest.approx(5.0)
    assert predicted_wait_s([4, 10], [Queued(8), Queued(1)], 2, rate) == pytest.approx(5.5)
    assert predicted_wait_s([4], [], 2, rate) == 0.0  # a free slot
    # nothing measured yet: the prior (tests/unit/test_queue_forecast_prefill.py)
    assert predicted_wait_s([4, 10], [Queued(8)], 2, ServiceRate()) > 0.0


def test_the_service_rate_learns_the_step_time_and_the_share_of_tokens_used() -> None:
    rate = ServiceRate(alpha=0.5)
    rate.observe_step(0.2, batch=16)
    rate.observe_step(0.4, batch=16)
    assert rate.step_s[16] == pytest.approx(0.3)
    rate.observe_finish(tokens=4, max_new_tokens=16)  # stopped early: a quarter used
    assert rate.used_share == pytest.approx(0.625)
    assert rate.token_s(16) == pytest.approx(0.3 * 0.625)


def test_an_unmeasured_batch_size_is_scaled_up_from_a_smaller_one() -> None:
    rate = ServiceRate(step_s={1: 0.05, 4: 0.1})
    assert rate.token_s(16) == pytest.approx(0.4)  # 4's time x 16/4: never an underestimate
    assert rate.token_s(2) == pytest.approx(0.1)  # 1's x 2
    assert ServiceRate(step_s={8: 0.2}).token_s(4) == pytest.approx(0.2)


def test_queued_sequences_the_forecast_puts_past_their_deadline_are_found() -> None:
    rate = ServiceRate(step_s={1: 1.0}, prompt_token_s=0.0)
    # one slot, 5 tokens left; the first queued (waited 0.2 s) starts at 5 s, fine; the second
    # (3 tokens, waited 0.4 s) would start at 8 s, 8.4 s > 8; the third takes its place at 8 s
    queued = [Queued(3, 0, 0.2), Queued(3, 0, 0.4), Queued(3, 0, 0.0)]
    assert late_in_queue([5], queued, 1, rate, timeout_s=8.0) == [1]
    assert late_in_queue([5], queued, 0, rate, timeout_s=8.0) == []  # no slot: nothing to say


def test_the_retry_hint_is_read_back_for_the_retry_after_header() -> None:
    assert retry_hint(8.2) == "retry after 9 s" and retry_hint(0.0) == "retry after 1 s"
    assert retry_after_s("generate: overloaded ...; retry after 9 s") == 9
    assert retry_after_s("generate: overloaded; retry later") == 1


def _ticking(now: list[float], step_s: float) -> Scheduler:
    """One slot, ``queue_timeout_s`` 10 s; every decoder call moves the fake clock ``step_s``."""

    def step(*args):  # type: ignore[no-untyped-def]
        now[0] += step_s
        return toy_step(*args)

    return Scheduler(
        step, empty_past, [EOS], max_running=1, max_queue=8, name="generate",
        queue_timeout_s=10.0, clock=lambda: now[0],
    )  # fmt: skip


def test_a_request_that_would_wait_past_queue_timeout_s_is_refused_at_once() -> None:
    now = [0.0]
    sched = _ticking(now, step_s=1.0)
    out: list = []
    running = make([1], 20, out=out)
    sched.submit(running)
    sched.step()  # a prefill and a decode (1 s measured per token), 18 tokens left
    late = make([3], 2, out=out)
    with pytest.raises(StageUnavailableError) as refused:
        sched.submit(late)  # ~18 s away: refused now, not after 10 s
    message = str(refused.value)
    assert "generate: overloaded" in message and "8 s of queue_timeout_s 10 s" in message
    assert says_unavailable(message) and retry_after_s(message) == 10  # 18 s less the 8 s
    assert list(sched.waiting) == [] and sched.batch.rows == [running]


def test_a_request_that_fits_is_queued_and_served() -> None:
    now = [0.0]
    sched = _ticking(now, step_s=0.5)
    out: list = []
    sched.submit(make([1], 4, out=out))
    sched.step()
    short = make([2], 2, out=out)
    sched.submit(short)  # ~3 tokens left at 1 s a step: within 10 s
    sched.run_until_idle()
    assert [r for i, _, r in out if i == short.id and r] == [FINISH_LENGTH]


def test_priorities_reorder_the_queue_and_the_forecast_counts_only_those_ahead() -> None:
    """Issue #36 item 4: a more urgent request (priority 1 before 2; none after every level)
    overtakes the queue, and its forecast counts only the requests ahead of it."""
    now = [0.0]
    sched = _ticking(now, step_s=1.0)
    sched.queue_timeout_s = 25.0  # all three fit (a prefill costs 1 s here)
    out: list = []
    sched.submit(make([1], 3, out=out))
    sched.step()  # running: 1 token left at 1 s a token
    plain, low, urgent = make([2], 4, out=out), make([3], 4, out=out), make([4], 4, out=out)
    low.priority, urgent.priority = 2, 1
    for seq in (plain, low, urgent):
        sched.submit(seq)
    assert list(sched.waiting) == [urgent, low, plain]
    # another urgent one waits for the running one and the urgent one only; a plain one for all
    # (each queued one's prompt token costs 1 s of prefill: the fake clock's tick)
    assert sched.predicted_wait_s(urgent.rank) == pytest.approx(6.0)
    assert sched.predicted_wait_s() == pytest.approx(16.0)
    sched.run_until_idle()
    finished = [i for i, _, r in out if r in (FINISH_LENGTH, "stop")]
    assert finished[1:] == [urgent.id, low.id, plain.id]


def test_the_admission_check_refuses_before_a_sequence_is_built() -> None:
    """Issue #36 item 5: the generate model asks :meth:`Scheduler.check_admission` before its
    chat template and tokenizer run, so a refusal under a flood costs neither."""
    now = [0.0]
    sched = _ticking(now, step_s=1.0)
    sched.submit(make([1], 20))
    sched.step()  # 18 tokens left at 1 s a token
    with pytest.raises(StageUnavailableError, match=r"a slot is about 18\.0 s away"):
        sched.check_admission()
    assert list(sched.waiting) == []
    sched.max_queue = 0
    with pytest.raises(StageUnavailableError, match="max_queue 0"):
        sched.check_admission(rank=1)


def test_the_queue_is_rechecked_while_the_loop_is_inside_a_long_step() -> None:
    """A queued sequence the forecast puts past its deadline is refused by the queue watcher
    while the loop is still inside a step (before: only at the next step, which on a busy host
    came seconds later: flood refusals after up to 5.2 s), within ``LATE_WINDOW_S`` of its
    arrival (later it is committed: tests/unit/test_queue_forecast_prefill.py)."""
    now = [0.0]
    inside, release = threading.Event(), threading.Event()

    def step(*args):  # type: ignore[no-untyped-def]
        if sched.steps >= 1:  # the loop's steps block until released
            inside.set()
            release.wait(30)
        else:
            now[0] += 1.0
        return toy_step(*args)

    sched = Scheduler(
        step, empty_past, [EOS], max_running=1, max_queue=8, name="generate",
        queue_timeout_s=10.0, clock=lambda: now[0],
    )  # fmt: skip
    out: list = []
    refused = threading.Event()
    running = make([1], 6, out=out)
    sched.submit(running)
    sched.step()  # measured: 1 s a token; 4 tokens left
    queued = make([2], 2, out=out)
    queued.on_error = lambda s, e: (out.append((s.id, e, "error")), refused.set())
    sched.submit(queued)  # a slot ~4 s away: queued
    sched.start()
    try:
        assert inside.wait(30), "the loop never entered its step"
        sched.rate.step_s[1] = 5.0  # the steps got slower: a slot ~20 s away now
        now[0] += 0.3  # within the window of its arrival
        assert refused.wait(30), "the late sequence was not refused during the step"
        assert not release.is_set()
        (error,) = [e for i, e, r in out if i == queued.id and r == "error"]
        assert "no slot predicted within 8 s of queue_timeout_s 10 s" in str(error)
    finally:
        release.set()
        sched.close()


def test_the_queue_priority_parameter_is_read_and_checked() -> None:
    """The front passes a tenant's priority as ``queue_priority`` (Triton keeps its own
    ``priority``); a bad value is refused naming the field."""
    assert queue_priority({}) == 0 and queue_priority({QUEUE_PRIORITY_PARAMETER: 2}) == 2
    for bad in (-1, "1", 1.5, True):
        with pytest.raises(InvalidInputError, match=QUEUE_PRIORITY_PARAMETER):
            queue_priority({QUEUE_PRIORITY_PARAMETER: bad})
