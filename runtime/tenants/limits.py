"""Per-tenant limits, pure and on an injectable clock: a token bucket (rate and burst) and a
quota per period (calendar-aligned: periods start at multiples of ``period_s`` since the epoch)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

Clock = Callable[[], float]


@dataclass
class TokenBucket:
    """``rate_per_s`` refill up to ``burst``. :meth:`take` spends when there is enough and says
    how long to wait otherwise; :meth:`charge` spends after the fact (the bucket may go into
    debt: the next :meth:`take` waits it out), for costs known only at the end (tokens)."""

    rate_per_s: float
    burst: float
    clock: Clock = time.monotonic
    level: float = field(init=False)
    at_s: float = field(init=False)

    def __post_init__(self) -> None:
        self.level, self.at_s = self.burst, self.clock()

    def _refill(self) -> None:
        now = self.clock()
        self.level = min(self.burst, self.level + (now - self.at_s) * self.rate_per_s)
        self.at_s = now

    def take(self, amount: float = 1.0) -> float:
        """0.0 when ``amount`` was spent, else the seconds until it could be (nothing spent)."""
        self._refill()
        if self.level >= amount:
            self.level -= amount
            return 0.0
        return (amount - self.level) / self.rate_per_s

    def charge(self, amount: float) -> None:
        self._refill()
        self.level -= amount


@dataclass
class Quota:
    """At most ``limit`` per period of ``period_s`` (wall-clock ``clock``)."""

    limit: int
    period_s: float
    clock: Clock = time.time
    used: int = 0
    period: int = -1

    def _roll(self) -> None:
        period = math.floor(self.clock() / self.period_s)
        if period != self.period:
            self.period, self.used = period, 0

    def exhausted(self) -> bool:
        self._roll()
        return self.used >= self.limit

    def charge(self, amount: int) -> None:
        self._roll()
        self.used += amount

    def reset_in_s(self) -> float:
        """Seconds until the next period starts."""
        self._roll()
        return (self.period + 1) * self.period_s - self.clock()
