"""Error translation and the retry policy: pure functions, shared by the sync and async clients.

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
from dataclasses import dataclass
from typing import TypeVar

from tritonclient.utils import InferenceServerException

from tritonforge.client.breaker import OPEN, CircuitBreaker
from tritonforge.client.errors import (
    ClientError,
    ConnectionFailedError,
    DeadlineExceededError,
    InvalidRequestError,
    ModelNotFoundError,
    OverloadedError,
    ServerError,
    ServerUnavailableError,
)

T = TypeVar("T")
log = logging.getLogger(__name__)

# gRPC UNAVAILABLE is also what a refused/reset connection looks like; these fragments say so.
_CONNECTION_HINTS = (
    "failed to connect",
    "connection refused",
    "connect failed",
    "connection reset",
    "socket closed",
    "dns resolution failed",
    "name resolution",
)
# What Triton answers while a model restarts (its stub crashed, the supervisor reloads it): whatever
# the status code, these are transient.
_RESTART_HINTS = (
    "no available versions",
    "is not healthy",
    "stub process",
    "tritonserver not reachable",
)
# What a model's queue (Triton) or generation's admission answers when it refuses for overload.
_OVERLOAD_HINTS = ("exceeds maximum queue size", "request timeout expired", "overloaded")
_INVALID_GRPC = {
    "INVALID_ARGUMENT",
    "FAILED_PRECONDITION",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "UNAUTHENTICATED",
}


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter, bounded by ``max_attempts`` and ``deadline_s``.

    The n-th retry waits ``min(max_backoff_s, initial_backoff_s * multiplier**(n-1))`` scaled by a
    random factor in ``[1 - jitter, 1]``; no retry starts after ``deadline_s`` since the first try.
    """

    max_attempts: int = 4
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    multiplier: float = 2.0
    jitter: float = 0.5
    deadline_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"jitter must be in [0, 1], got {self.jitter}")
        if self.initial_backoff_s < 0 or self.max_backoff_s < 0 or self.multiplier < 1:
            raise ValueError("backoffs must be >= 0 and multiplier >= 1")
        if self.deadline_s <= 0:
            raise ValueError(f"deadline_s must be > 0, got {self.deadline_s}")

    def backoff_s(self, retry: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait before retry number ``retry`` (1-based); ``rand`` returns [0, 1)."""
        ceiling = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (retry - 1))
        return ceiling * (1.0 - self.jitter * rand())


def _gevent_timeout() -> type[BaseException] | None:
    try:
        import gevent
    except ImportError:  # pragma: no cover - gevent ships with tritonclient[http]
        return None
    return gevent.Timeout


def _aiohttp_error() -> type[BaseException] | None:
    try:
        import aiohttp
    except ImportError:  # pragma: no cover - aiohttp ships with tritonclient[http]
        return None
    return aiohttp.ClientError


def _unavailable(text: str, message: str) -> ServerUnavailableError:
    if any(hint in message.lower() for hint in _OVERLOAD_HINTS):
        return OverloadedError(f"{text} (overloaded; retry later or degrade)")
    return ServerUnavailableError(f"{text} (server or model not ready; retry later)")


def _from_status(status: str, message: str, context: str) -> ClientError:
    text = f"{context}: {message}"
    if any(hint in message.lower() for hint in _RESTART_HINTS):
        return ServerUnavailableError(f"{text} (the model is restarting; retry later)")
    if status.isdigit():
        code = int(status)
        if code == 404:
            return ModelNotFoundError(f"{text} (is the model name right and the model loaded?)")
        if code == 503:
            return _unavailable(text, message)
        if code in (408, 504):
            return DeadlineExceededError(text)
        if 400 <= code < 500:
            return InvalidRequestError(text)
        return ServerError(f"{text} (see the server log)")
    name = status.removeprefix("StatusCode.")
    if name == "UNAVAILABLE":
        lowered = message.lower()
        if "restricted" in lowered:
            return InvalidRequestError(
                f"{text} (endpoint restricted by the server's configuration)"
            )
        if any(hint in lowered for hint in _CONNECTION_HINTS):
            return ConnectionFailedError(f"{text} (is the server running at that address?)")
        return _unavailable(text, message)
    if name == "NOT_FOUND":
        return ModelNotFoundError(f"{text} (is the model name right and the model loaded?)")
    if name in _INVALID_GRPC:
        return InvalidRequestError(text)
    if name == "DEADLINE_EXCEEDED":
        return DeadlineExceededError(text)
    if name in ("INTERNAL", "UNKNOWN", "DATA_LOSS", "RESOURCE_EXHAUSTED"):
        return ServerError(f"{text} (see the server log)")
    return ClientError(f"{text} [{status}]")


def translate(exc: BaseException, context: str) -> ClientError:
    """Map any exception raised by a tritonclient call to a :class:`ClientError`.

    ``context`` names the call (model, URL, timeout); it prefixes the message. The caller chains
    the original with ``raise translate(e, ctx) from e``.
    """
    if isinstance(exc, ClientError):
        return exc
    if isinstance(exc, InferenceServerException):
        message = exc.message() or str(exc)
        status = exc.status()
        if status:
            return _from_status(str(status), message, context)
        lowered = message.lower()
        if "timed out" in lowered or "timeout" in lowered:
            return DeadlineExceededError(f"{context}: {message}")
        if any(hint in lowered for hint in _CONNECTION_HINTS):
            return ConnectionFailedError(f"{context}: {message}")
        return ClientError(f"{context}: {message}")
    gevent_timeout = _gevent_timeout()
    if isinstance(exc, TimeoutError) or (gevent_timeout and isinstance(exc, gevent_timeout)):
        return DeadlineExceededError(f"{context}: timed out ({type(exc).__name__}: {exc})")
    aiohttp_error = _aiohttp_error()
    if isinstance(exc, OSError) or (aiohttp_error and isinstance(exc, aiohttp_error)):
        return ConnectionFailedError(
            f"{context}: cannot reach the server ({type(exc).__name__}: {exc}); "
            "is it running at that address?"
        )
    return ClientError(f"{context}: unexpected {type(exc).__name__}: {exc}")


def _retryable_exception(exc: BaseException) -> bool:
    """Exceptions translate() handles; KeyboardInterrupt, SystemExit, CancelledError pass."""
    if isinstance(exc, Exception):
        return True
    gevent_timeout = _gevent_timeout()
    return bool(gevent_timeout and isinstance(exc, gevent_timeout))


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
    start = clock()
    attempt = 0
    while True:
        attempt += 1
        probe = _acquire(breaker, attempt)
        try:
            result = fn(max(0.0, policy.deadline_s - (clock() - start)))
        except BaseException as e:
            delay = _retry_delay(e, attempt, clock() - start, policy, context, rand, breaker, probe)
            sleep(delay)
            continue
        if breaker is not None:
            breaker.record(probe, ok=True)
        return result


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
    start = clock()
    attempt = 0
    while True:
        attempt += 1
        probe = _acquire(breaker, attempt)
        try:
            result = await fn(max(0.0, policy.deadline_s - (clock() - start)))
        except BaseException as e:
            delay = _retry_delay(e, attempt, clock() - start, policy, context, rand, breaker, probe)
            await asyncio.sleep(delay)
            continue
        if breaker is not None:
            breaker.record(probe, ok=True)
        return result
