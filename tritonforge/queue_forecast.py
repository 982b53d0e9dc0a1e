"""How long a request queued now would wait for a decoding slot, from what the scheduler measured.

The generate engine decodes at most ``max_running`` sequences together; the rest wait in a FIFO
queue and are refused after ``queue_timeout_s``. Under a flood, waiting that long only to hear no
is the worst answer, so :class:`Scheduler.submit` refuses at once a request whose predicted wait
is past ``queue_timeout_s``. The prediction (:func:`predicted_wait_s`) simulates the slots: each
running sequence frees its slot after the tokens it may still decode, each queued one holds a
slot for its ``max_new_tokens``, every token costing the measured seconds per scheduler step
scaled by the measured share of ``max_new_tokens`` that sequences really decode (a stop or EOS
ends them earlier): :class:`ServiceRate`. Before any step was measured nothing is predicted
(wait 0: the queue deadline still applies); the generate engine's warm-up measures a full batch.
The scheduler also re-checks its queue at every step (:func:`late_in_queue`): a sequence the
prediction now puts past its deadline is refused then, not when the deadline comes.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class ServiceRate:
    """Exponentially weighted measurements (``alpha``: the weight of the newest): seconds per
    decode step by batch size; seconds per token a finished sequence really took from its
    admission (prefills and contention included: ``served_token_s``); and the share of
    ``max_new_tokens`` it decoded (1.0 until one finished: the longest service, so the first
    guesses refuse rather than accept a request that would time out)."""

    step_s: dict[int, float] = field(default_factory=dict)
    served_token_s: float | None = None
    used_share: float = 1.0
    alpha: float = 0.2

    def observe_step(self, seconds: float, batch: int) -> None:
        if seconds < 0 or batch <= 0:
            return
        old = self.step_s.get(batch)
        self.step_s[batch] = seconds if old is None else self._mix(old, seconds)

    def observe_finish(self, tokens: int, max_new_tokens: int, served_s: float = 0.0) -> None:
        """A sequence finished after ``tokens`` of ``max_new_tokens``, ``served_s`` after its
        admission (0: not timed)."""
        if max_new_tokens > 0:
            self.used_share = self._mix(self.used_share, min(1.0, tokens / max_new_tokens))
        if tokens > 0 and served_s > 0:
            per_token = served_s / tokens
            old = self.served_token_s
            self.served_token_s = per_token if old is None else self._mix(old, per_token)

    def _mix(self, old: float, new: float) -> float:
        return (1 - self.alpha) * old + self.alpha * new

    def token_s(self, batch: int) -> float | None:
        """Expected seconds of service per token of ``max_new_tokens`` while ``batch`` sequences
        decode together (a queue only forms behind a full batch): the step time measured at that
        size, else at the largest size measured below it scaled up in proportion (an
        overestimate: a step's fixed costs do not grow with the batch), or what finished
        sequences really took per token when that is longer; None: nothing measured."""
        if batch in self.step_s:
            step_s = self.step_s[batch]
        else:
            below = [b for b in self.step_s if b < batch]
            if below:
                step_s = self.step_s[max(below)] * batch / max(below)
            elif self.step_s:
                step_s = self.step_s[min(self.step_s)]
            else:
                return None
        return max(step_s, self.served_token_s or 0.0) * self.used_share


def _slots(running_left: Sequence[int], max_running: int, token_s: float) -> list[float]:
    slots = [max(0, n) * token_s for n in running_left][:max_running]
    slots += [0.0] * (max_running - len(slots))
    heapq.heapify(slots)
    return slots


def predicted_wait_s(
    running_left: Sequence[int], queued: Sequence[int], max_running: int, rate: ServiceRate
) -> float:
    """Seconds until a request queued behind ``queued`` gets a slot: ``running_left`` are the
    tokens each running sequence may still decode, ``queued`` the ``max_new_tokens`` of each one
    waiting ahead (FIFO); 0 when a slot is free for it or nothing was measured yet."""
    token_s = rate.token_s(max_running)
    if token_s is None or max_running <= 0:
        return 0.0
    slots = _slots(running_left, max_running, token_s)
    for tokens in queued:
        heapq.heappush(slots, heapq.heappop(slots) + max(0, tokens) * token_s)
    return slots[0]


def late_in_queue(
    running_left: Sequence[int],
    queued: Sequence[tuple[int, float]],
    max_running: int,
    rate: ServiceRate,
    timeout_s: float,
) -> list[int]:
    """Indexes of the ``queued`` sequences (``(max_new_tokens, seconds waited so far)``, FIFO)
    that are predicted to get no slot before they waited ``timeout_s``: refused now rather than
    at their deadline (the prediction got worse since they were queued). Each one refused frees
    its place for those behind it."""
    token_s = rate.token_s(max_running)
    if token_s is None or max_running <= 0:
        return []
    slots = _slots(running_left, max_running, token_s)
    late = []
    for i, (tokens, waited_s) in enumerate(queued):
        if waited_s + slots[0] > timeout_s:
            late.append(i)
            continue
        heapq.heappush(slots, heapq.heappop(slots) + max(0, tokens) * token_s)
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
