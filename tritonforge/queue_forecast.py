"""How long a request queued now would wait for a decoding slot, from what the scheduler measured.

The generate engine decodes at most ``max_running`` sequences together; the rest wait in a FIFO
queue and are refused after ``queue_timeout_s``. Under a flood, waiting that long only to hear no
is the worst answer, so :class:`Scheduler.submit` refuses at once a request whose predicted wait
is past :func:`admit_budget_s` (``queue_timeout_s`` less a margin for the forecast's error). The prediction (:func:`predicted_wait_s`) simulates the slots: each
running sequence frees its slot after the tokens it may still decode; each queued one, when it
gets a slot, is first prefilled (its prompt's tokens at the measured seconds per prompt token;
the whole batch stalls meanwhile: the prefill delays every slot) and then holds its slot for its
``max_new_tokens``, every token costing the measured seconds per decode step scaled by the
measured share of ``max_new_tokens`` that sequences really decode (a stop or EOS ends them
earlier): :class:`ServiceRate`. Before anything is measured a safe prior stands in (slower than
this project's 2-core host under a flood); the generate engine's warm-up measures a full batch.

The scheduler re-checks its queue (:func:`late_in_queue`): a sequence the prediction now puts
past its deadline is refused then, but only within :data:`LATE_WINDOW_S` of its arrival (its
refusal still reaches the client within 1 s); after that it is committed and keeps its place,
refused only if it still has no slot after :func:`overdue_s` (twice ``queue_timeout_s``).
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field

# The prior, before anything is measured (a full batch's step and a prompt token each measured
# 0.17-0.27 s / 16 rows and ~3.3 ms on the shared 2-core host under a 96-stream flood): safe
# means slower than measured, so an unmeasured flood is refused rather than left to time out.
PRIOR_ROW_STEP_S = 0.025  # seconds per decode step per running sequence
PRIOR_PROMPT_TOKEN_S = 0.005  # seconds of prefill per prompt token
LATE_WINDOW_S = 0.6  # a queued sequence may be refused this long after its arrival, not later
# the share of queue_timeout_s a predicted wait may take: the forecast's margin (on the shared
# host under a short-answer flood it was up to ~8% short, and the deadline then refused one)
ADMIT_SHARE = 0.8


# a committed sequence (admitted, past the late window) is refused only this many times
# queue_timeout_s after its arrival: a guard for a forecast gone wrong, not an answer to expect
OVERDUE_FACTOR = 2.0


def admit_budget_s(queue_timeout_s: float) -> float:
    """The longest predicted wait admitted: :data:`ADMIT_SHARE` of ``queue_timeout_s``."""
    return ADMIT_SHARE * queue_timeout_s


def overdue_s(queue_timeout_s: float) -> float:
    """How long a queued sequence may wait for its slot before it is refused after all:
    :data:`OVERDUE_FACTOR` x ``queue_timeout_s``. A forecast that fell short (the flood itself
    slows the steps measured before it) then serves a committed request late rather than
    refusing it after it waited the timeout out."""
    return OVERDUE_FACTOR * queue_timeout_s


@dataclass(frozen=True)
class Queued:
    """A sequence waiting for a slot: its ``max_new_tokens``, its prompt's length, and (for
    :func:`late_in_queue`) how long it has waited."""

    max_new_tokens: int
    prompt_tokens: int = 0
    waited_s: float = 0.0


@dataclass
class ServiceRate:
    """Exponentially weighted measurements (``alpha``: the weight of the newest): seconds per
    decode step by batch size; seconds of prefill per prompt token (``prompt_token_s``, padded
    tokens of a prefill call); and the share of ``max_new_tokens`` a finished sequence decoded
    (1.0 until one finished: the longest service, so the first guesses refuse rather than
    accept a request that would time out)."""

    step_s: dict[int, float] = field(default_factory=dict)
    prompt_token_s: float | None = None
    used_share: float = 1.0
    alpha: float = 0.2

    def observe_step(self, seconds: float, batch: int) -> None:
        if seconds < 0 or batch <= 0:
            return
        old = self.step_s.get(batch)
        self.step_s[batch] = seconds if old is None else self._mix(old, seconds)

    def observe_prefill(self, seconds: float, padded_tokens: int) -> None:
        """A prefill call of ``padded_tokens`` (rows x width) took ``seconds``."""
        if seconds < 0 or padded_tokens <= 0:
            return
        per_token, old = seconds / padded_tokens, self.prompt_token_s
        self.prompt_token_s = per_token if old is None else self._mix(old, per_token)

    def observe_finish(self, tokens: int, max_new_tokens: int) -> None:
        """A sequence finished after ``tokens`` of ``max_new_tokens``."""
        if max_new_tokens > 0:
            self.used_share = self._mix(self.used_share, min(1.0, tokens / max_new_tokens))

    def forget_share(self) -> None:
        """Back to the longest service (share 1.0): after a warm-up whose prompt stops early."""
        self.used_share = 1.0

    def _mix(self, old: float, new: float) -> float:
        return (1 - self.alpha) * old + self.alpha * new

    def token_s(self, batch: int) -> float:
        """Expected seconds of service per token of ``max_new_tokens`` while ``batch`` sequences
        decode together (a queue only forms behind a full batch): the step time measured at that
        size, else at the largest size measured below it scaled up in proportion (an
        overestimate: a step's fixed costs do not grow with the batch), else the prior."""
        if batch in self.step_s:
            step_s = self.step_s[batch]
        else:
            below = [b for b in self.step_s if b < batch]
            if below:
                step_s = self.step_s[max(below)] * batch / max(below)
            elif self.step_s:
                step_s = self.step_s[min(self.step_s)]
            else:
                step_s = PRIOR_ROW_STEP_S * max(1, batch)
        return step_s * self.used_share

    def prefill_s(self, prompt_tokens: int) -> float:
        """Expected seconds to prefill a prompt of ``prompt_tokens`` (measured, else the prior)."""
        per_token = PRIOR_PROMPT_TOKEN_S if self.prompt_token_s is None else self.prompt_token_s
        return max(0, prompt_tokens) * per_token


def slot_starts(
    running_left: Sequence[int],
    queued: Sequence[Queued],
    max_running: int,
    rate: ServiceRate,
    busy_s: float = 0.0,
) -> Generator[float, bool | None, None]:
    """Seconds from now until each of ``queued`` (FIFO) gets a slot, then until one more would:
    ``running_left`` are the tokens each running sequence may still decode, ``busy_s`` the
    seconds the engine is still busy before any of them decodes (a prefill under way). The
    caller may ``send(False)`` after a start to say that sequence will not take its slot."""
    if max_running <= 0:
        return
    token_s = rate.token_s(max_running)
    slots = [busy_s + max(0, n) * token_s for n in running_left][:max_running]
    slots += [busy_s] * (max_running - len(slots))
    heapq.heapify(slots)
    shift = 0.0  # every slot's time moves by the prefills done before it: stored relative
    for seq in queued:
        start = slots[0] + shift
        if (yield start) is False:
            continue
        heapq.heappop(slots)
        prefill_s = rate.prefill_s(seq.prompt_tokens)
        shift += prefill_s  # the whole batch stalls while it is prefilled
        heapq.heappush(slots, start + prefill_s + max(0, seq.max_new_tokens) * token_s - shift)
    yield slots[0] + shift


def predicted_wait_s(
    running_left: Sequence[int],
    queued: Sequence[Queued],
    max_running: int,
    rate: ServiceRate,
    busy_s: float = 0.0,
) -> float:
    """Seconds until a request queued behind ``queued`` gets a slot (:func:`slot_starts`); 0
    when a slot is free for it and the engine is idle."""
    starts = list(slot_starts(running_left, queued, max_running, rate, busy_s))
    return starts[-1] if starts else 0.0


def late_in_queue(
    running_left: Sequence[int],
    queued: Sequence[Queued],
    max_running: int,
    rate: ServiceRate,
    timeout_s: float,
    busy_s: float = 0.0,
    window_s: float = LATE_WINDOW_S,
) -> list[int]:
    """Indexes of the ``queued`` sequences (FIFO, with ``waited_s``) that are predicted to get
    no slot before they waited ``timeout_s`` and arrived less than ``window_s`` ago: refused
    now, within the window, rather than at their deadline (the prediction got worse since they
    were queued). One that waited longer is committed: it keeps its place. Each one refused
    frees its place for those behind it."""
    late: list[int] = []
    starts = slot_starts(running_left, queued, max_running, rate, busy_s)
    start = next(starts, None)
    if start is None:  # no slot at all (max_running 0)
        return []
    for i, seq in enumerate(queued):
        refuse = seq.waited_s < window_s and seq.waited_s + start > timeout_s
        if refuse:
            late.append(i)
        start = starts.send(not refuse)
    return late


_RETRY_AFTER = re.compile(r"retry after (\d{1,6}) s\b")


def retry_hint(seconds: float) -> str:
    """The end of a refusal saying when to retry (whole seconds, at least 1): what
    :func:`retry_after_s` reads back for the front's ``Retry-After`` header."""
    return f"retry after {max(1, math.ceil(seconds))} s"


def retry_after_s(message: str, default: int = 1) -> int:
    """The seconds a refusal's text says to wait (:func:`retry_hint`), else ``default``."""
    found = _RETRY_AFTER.search(message)
    return int(found.group(1)) if found else default
