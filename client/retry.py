"""The retry policy and its loop, written once for the sync and async clients (errors are
translated by :mod:`client.status`).

Only *transient* failures are retried (HTTP 503, gRPC UNAVAILABLE that is not an endpoint
restriction, connection errors), with exponential backoff, jitter, a cap on attempts and an overall
deadline. Caller mistakes (HTTP 4xx, gRPC INVALID_ARGUMENT...) fail at once: retrying them only adds
load and latency.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from tritonforge.client.bounds import above, at_least, check_bounds
from tritonforge.client.breaker import OPEN, CircuitBreaker
from tritonforge.client.coroutines import finish
from tritonforge.client.errors import ClientError, DeadlineExceededError
from tritonforge.client.status import from_status, gevent_timeout, translate

__all__ = ["RetryPolicy", "breaker_failure", "call_with_retry", "call_with_retry_async"]
__all__ += ["from_status", "translate"]  # translation's old home (client.status)

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter, bounded by ``max_attempts`` and ``deadline_s``.

    The n-th retry waits ``min(max_backoff_s, initial_backoff_s * multiplier**(n-1))`` scaled by a
    random factor in ``[1 - jitter, 1]``; no retry starts after ``deadline_s`` since the first try.
    """

    max_attempts: int = field(default=4, metadata=at_least(1))
    initial_backoff_s: float = field(default=0.05, metadata=at_least(0))
    max_backoff_s: float = field(default=2.0, metadata=at_least(0))
    multiplier: float = field(default=2.0, metadata=at_least(1))
    jitter: float = field(default=0.5, metadata=at_least(0, 1))
    deadline_s: float = field(default=30.0, metadata=above(0))

    def __post_init__(self) -> None:
        check_bounds(self)

    def backoff_s(self, retry: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait before retry number ``retry`` (1-based); ``rand`` returns [0, 1)."""
        ceiling = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (retry - 1))
        return ceiling * (1.0 - self.jitter * rand())


def _retryable_exception(exc: BaseException) -> bool:
    """Exceptions translate() handles; KeyboardInterrupt, SystemExit, CancelledError pass."""
    if isinstance(exc, Exception):
        return True
    gevent = gevent_timeout()
    return bool(gevent and isinstance(exc, gevent))


def _give_up(err: ClientError, attempt: int, elapsed_s: float, why: str) -> ClientError:
    err.attempts = attempt
    if attempt > 1:
        err.args = (
            f"{err.args[0]} [gave up after {attempt} attempts in {elapsed_s:.2f} s: {why}]",
        )
    return err


def breaker_failure(err: ClientError) -> bool:
    """What counts against the breaker: transient failures and timeouts (the server did not
    answer); anything else (a 4xx, a bad answer) proves it answers."""
    return err.transient or isinstance(err, DeadlineExceededError)


def _retry_delay(
    e: BaseException,
    attempt: int,
    elapsed: float,
    policy: RetryPolicy,
    context: str,
    rand: Callable[[], float],
    breaker: CircuitBreaker | None = None,
    probe: bool = False,
) -> float:
    """Seconds to wait before the next attempt after ``e``; re-raises when giving up (the
    translated error, ``from e``) or when ``e`` is not ours to retry (e.g. KeyboardInterrupt).
    ``breaker`` (the call was allowed by it, as the probe or not) gets the verdict first."""
    if not _retryable_exception(e):
        if breaker is not None:
            breaker.release(probe)
        raise e
    err = translate(e, context)
    if breaker is not None:
        breaker.record(probe, ok=not breaker_failure(err))
    if not err.transient:
        raise _give_up(err, attempt, elapsed, "not transient") from e
    if breaker is not None and breaker.state == OPEN:
        raise _give_up(err, attempt, elapsed, f"circuit for {breaker.server} opened") from e
    if attempt >= policy.max_attempts:
        raise _give_up(err, attempt, elapsed, f"max_attempts {policy.max_attempts}") from e
    delay = policy.backoff_s(attempt, rand)
    if elapsed + delay >= policy.deadline_s:
        raise _give_up(err, attempt, elapsed, f"deadline {policy.deadline_s:g} s") from e
    log.warning(
        "attempt %d/%d failed (%s: %s); retrying in %.2f s",
        attempt,
        policy.max_attempts,
        type(err).__name__,
        err,
        delay,
    )
    return delay


def _acquire(breaker: CircuitBreaker | None, attempt: int) -> bool:
    if breaker is None:
        return False
    try:
        return breaker.acquire()
    except ClientError as e:
        e.attempts = attempt
        raise


async def _retrying(
    fn: Callable[[float], Awaitable[T]],
    policy: RetryPolicy,
    context: str,
    breaker: CircuitBreaker | None,
    sleep: Callable[[float], Awaitable[None]],
    clock: Callable[[], float],
    rand: Callable[[], float],
) -> T:
    """The retry loop of both clients: see :func:`call_with_retry`."""
    start = clock()
    attempt = 0
    while True:
        attempt += 1
        probe = _acquire(breaker, attempt)
        try:
            result = await fn(max(0.0, policy.deadline_s - (clock() - start)))
        except BaseException as e:
            delay = _retry_delay(e, attempt, clock() - start, policy, context, rand, breaker, probe)
            await sleep(delay)
            continue
        if breaker is not None:
            breaker.record(probe, ok=True)
        return result


def call_with_retry(
    fn: Callable[[float], T],
    policy: RetryPolicy,
    context: str,
    *,
    breaker: CircuitBreaker | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    rand: Callable[[], float] = random.random,
) -> T:
    """Call ``fn(remaining_s)`` until it succeeds, fails permanently or the policy is spent.

    ``remaining_s`` is the time left to the overall deadline (for per-attempt timeouts). Raises
    the translated :class:`ClientError` of the last attempt, with ``attempts`` set; every attempt
    asks ``breaker`` first (:class:`CircuitOpenError` when it is open) and reports to it.
    """

    async def attempt(remaining_s: float) -> T:
        return fn(remaining_s)

    async def pause(seconds: float) -> None:
        sleep(seconds)

    return finish(_retrying(attempt, policy, context, breaker, pause, clock, rand))


async def call_with_retry_async(
    fn: Callable[[float], Awaitable[T]],
    policy: RetryPolicy,
    context: str,
    *,
    breaker: CircuitBreaker | None = None,
    clock: Callable[[], float] = time.monotonic,
    rand: Callable[[], float] = random.random,
) -> T:
    """Asyncio twin of :func:`call_with_retry` (sleeps with ``asyncio.sleep``)."""
    return await _retrying(fn, policy, context, breaker, asyncio.sleep, clock, rand)
