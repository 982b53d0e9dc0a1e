"""How long a request queued now would wait for a decoding slot, from what the scheduler measured.

The generate engine decodes at most ``max_running`` sequences together; the rest wait in a FIFO
queue and are refused after ``queue_timeout_s``. Under a flood, waiting that long only to hear no
is the worst answer, so :class:`Scheduler.submit` refuses at once a request whose predicted wait
is past ``queue_timeout_s``. The prediction (:func:`predicted_wait_s`) simulates the slots: each
running sequence frees its slot after the tokens it may still decode, each queued one holds a
slot for its ``max_new_tokens``, every token costing the measured seconds per scheduler step
scaled by the measured share of ``max_new_tokens`` that sequences really decode (a stop or EOS
ends them earlier): :class:`ServiceRate`. Before any step was measured nothing is predicted
(wait 0: the queue deadline still applies).
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class ServiceRate:
    """Exponentially weighted measurements (``alpha``: the weight of the newest): seconds per
    scheduler step while sequences run, and the share of ``max_new_tokens`` a finished sequence
    decoded (1.0 until one finished: the longest service, so the first guesses refuse rather than
    accept a request that would time out)."""

    step_s: float | None = None
    used_share: float = 1.0
    alpha: float = 0.2

    def observe_step(self, seconds: float) -> None:
        if seconds < 0:
            return
        self.step_s = seconds if self.step_s is None else self._mix(self.step_s, seconds)

    def observe_finish(self, tokens: int, max_new_tokens: int) -> None:
        if max_new_tokens > 0:
            self.used_share = self._mix(self.used_share, min(1.0, tokens / max_new_tokens))

    def _mix(self, old: float, new: float) -> float:
        return (1 - self.alpha) * old + self.alpha * new

    @property
    def token_s(self) -> float | None:
        """Expected seconds of service per token of ``max_new_tokens`` (None: not measured)."""
        return None if self.step_s is None else self.step_s * self.used_share


def predicted_wait_s(
    running_left: Sequence[int], queued: Sequence[int], max_running: int, rate: ServiceRate
) -> float:
    """Seconds until a request queued behind ``queued`` gets a slot: ``running_left`` are the
    tokens each running sequence may still decode, ``queued`` the ``max_new_tokens`` of each one
    waiting ahead (FIFO); 0 when a slot is free for it or nothing was measured yet."""
    token_s = rate.token_s
    if token_s is None or max_running <= 0:
        return 0.0
    slots = [max(0, n) * token_s for n in running_left][:max_running]
    slots += [0.0] * (max_running - len(slots))
    heapq.heapify(slots)
    for tokens in queued:
        heapq.heappush(slots, heapq.heappop(slots) + max(0, tokens) * token_s)
    return slots[0]


_RETRY_AFTER = re.compile(r"retry after (\d{1,6}) s\b")


def retry_hint(seconds: float) -> str:
    """The end of a refusal saying when to retry (whole seconds, at least 1): what
    :func:`retry_after_s` reads back for the front's ``Retry-After`` header."""
    return f"retry after {max(1, math.ceil(seconds))} s"


def retry_after_s(message: str, default: int = 1) -> int:
    """The seconds a refusal's text says to wait (:func:`retry_hint`), else ``default``."""
    found = _RETRY_AFTER.search(message)
    return int(found.group(1)) if found else default
