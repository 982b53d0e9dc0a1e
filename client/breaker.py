"""A circuit breaker per server, shared by the sync, async and generation clients.

``closed``: calls go through; ``failure_threshold`` consecutive *transient* failures (connection
refused, HTTP 503 / gRPC UNAVAILABLE) within ``window_s`` open it. ``open``: every call fails at
once with :class:`CircuitOpenError` naming the server, without touching the network, for
``cooldown_s``. ``half_open``: after the cool-down exactly one call (the probe) goes through and
the others keep failing fast; its success closes the breaker, its failure opens it for another
cool-down. So a dead or saturated server sees at most one request per cool-down from this client
instead of a retry storm. Errors that are the caller's (HTTP 4xx) prove the server answers: they
count as successes. State changes are logged (``tritonforge.client.breaker``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tritonforge.client.bounds import above, at_least, check_bounds
from tritonforge.client.errors import CircuitOpenError

log = logging.getLogger(__name__)

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


@dataclass(frozen=True)
class BreakerPolicy:
    """When the circuit opens and for how long (``failure_threshold`` 0 turns it off)."""

    failure_threshold: int = field(default=5, metadata=at_least(0))
    """Consecutive transient failures within ``window_s`` that open the circuit."""
    window_s: float = field(default=10.0, metadata=above(0))
    """Seconds over which those failures count."""
    cooldown_s: float = field(default=5.0, metadata=above(0))
    """Seconds the circuit stays open before one probe goes through."""

    def __post_init__(self) -> None:
        check_bounds(self)

    @property
    def enabled(self) -> bool:
        return self.failure_threshold > 0


class CircuitBreaker:
    """Thread-safe; ``clock`` (monotonic seconds) is injectable for tests.

    Use: ``token = breaker.acquire()`` before a call (raises :class:`CircuitOpenError`), then
    ``breaker.record(token, ok)`` with ``ok`` False only for a transient failure, or
    ``breaker.release(token)`` when the call ended without a verdict (cancelled).
    """

    def __init__(
        self,
        server: str,
        policy: BreakerPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.server = server
        self.policy = policy or BreakerPolicy()
        self.clock = clock
        self._lock = threading.Lock()
        self._state = CLOSED
        self._failures: deque[float] = deque()
        self._opened_at = 0.0
        self._probing = False

    @property
    def state(self) -> str:
        """closed | open | half_open (open turns half_open once the cool-down has passed)."""
        with self._lock:
            if self._state == OPEN and self.clock() - self._opened_at >= self.policy.cooldown_s:
                return HALF_OPEN
            return self._state

    def acquire(self) -> bool:
        """Permission for one call; True when that call is the half-open probe."""
        if not self.policy.enabled:
            return False
        with self._lock:
            now = self.clock()
            if self._state == CLOSED:
                return False
            if self._state == OPEN and now - self._opened_at >= self.policy.cooldown_s:
                self._state = HALF_OPEN
                log.info("circuit for %s half-open: sending one probe", self.server)
            if self._state == HALF_OPEN and not self._probing:
                self._probing = True
                return True
            wait_s = max(0.0, self.policy.cooldown_s - (now - self._opened_at))
            why = (
                "a probe is in flight"
                if self._state == HALF_OPEN
                else f"next probe in {wait_s:.1f} s"
            )
            raise CircuitOpenError(
                f"circuit open for {self.server}: {len(self._failures)} consecutive transient "
                f"failures; failing fast ({why})",
                server=self.server,
                retry_after_s=wait_s,
            )

    def record(self, probe: bool, ok: bool) -> None:
        """The verdict of a call allowed by :meth:`acquire` (``probe`` is what it returned)."""
        if not self.policy.enabled:
            return
        with self._lock:
            now = self.clock()
            if probe:
                self._probing = False
            if ok:
                if self._state != CLOSED:
                    log.info("circuit for %s closed: the server answers again", self.server)
                self._state = CLOSED
                self._failures.clear()
                return
            if probe or self._state == HALF_OPEN:
                self._open(now, "the probe failed")
                return
            if self._state == OPEN:
                return  # a call that started before the breaker opened
            self._failures.append(now)
            while self._failures and now - self._failures[0] > self.policy.window_s:
                self._failures.popleft()
            if len(self._failures) >= self.policy.failure_threshold:
                self._open(
                    now,
                    f"{len(self._failures)} transient failures within {self.policy.window_s:g} s",
                )

    def release(self, probe: bool) -> None:
        """A call ended without a verdict (e.g. cancelled): free the probe slot."""
        if probe:
            with self._lock:
                self._probing = False

    def _open(self, now: float, why: str) -> None:
        self._state = OPEN
        self._opened_at = now
        log.warning(
            "circuit for %s open (%s): failing fast for %g s",
            self.server,
            why,
            self.policy.cooldown_s,
        )
