"""The client's circuit breaker: states on a fake clock, and what the retry loop and the
generation client do with it (fake callables, no server)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Iterator

import pytest
from tritonclient.utils import InferenceServerException

from tritonforge.client import generate
from tritonforge.client.breaker import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    BreakerPolicy,
    CircuitBreaker,
)
from tritonforge.client.errors import (
    CircuitOpenError,
    ConnectionFailedError,
    InvalidRequestError,
    ServerUnavailableError,
)
from tritonforge.client.retry import RetryPolicy, call_with_retry, call_with_retry_async
from tritonforge.client.settings import ClientSettings

SERVER = "http://inference.example:8000"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def breaker(clock: FakeClock, failures: int = 3) -> CircuitBreaker:
    return CircuitBreaker(SERVER, BreakerPolicy(failures, window_s=10.0, cooldown_s=5.0), clock)


def fail(b: CircuitBreaker, n: int = 1) -> None:
    for _ in range(n):
        b.record(b.acquire(), ok=False)


def test_opens_after_n_consecutive_transient_failures_and_fails_fast_naming_the_server() -> None:
    clock = FakeClock()
    b = breaker(clock)
    fail(b, 2)
    b.record(b.acquire(), ok=True)  # a success resets the count: failures must be consecutive
    fail(b, 2)
    assert b.state == CLOSED
    fail(b)
    assert b.state == OPEN
    with pytest.raises(CircuitOpenError, match=r"circuit open for http://inference\.example") as e:
        b.acquire()
    assert e.value.server == SERVER and e.value.retry_after_s == pytest.approx(5.0)
    assert not e.value.transient  # the retry loop must not retry it
    assert isinstance(e.value, ServerUnavailableError)


def test_failures_outside_the_window_do_not_add_up() -> None:
    clock = FakeClock()
    b = breaker(clock)
    fail(b, 2)
    clock.now += 11.0
    fail(b, 2)
    assert b.state == CLOSED
    fail(b)
    assert b.state == OPEN


def test_half_open_lets_exactly_one_probe_through_per_cooldown() -> None:
    clock = FakeClock()
    b = breaker(clock)
    fail(b, 3)
    clock.now += 4.9
    with pytest.raises(CircuitOpenError):
        b.acquire()
    clock.now += 0.1
    assert b.state == HALF_OPEN
    probe = b.acquire()
    assert probe is True
    with pytest.raises(CircuitOpenError, match="probe is in flight"):
        b.acquire()  # everyone else still fails fast while the probe runs
    b.record(probe, ok=False)  # the probe failed: open for another full cool-down
    assert b.state == OPEN
    clock.now += 4.9
    with pytest.raises(CircuitOpenError):
        b.acquire()
    clock.now += 0.1
    probe = b.acquire()
    b.record(probe, ok=True)
    assert b.state == CLOSED
    assert b.acquire() is False and b.acquire() is False  # closed: no probes, no limit


def test_a_cancelled_probe_frees_the_slot() -> None:
    clock = FakeClock()
    b = breaker(clock)
    fail(b, 3)
    clock.now += 5.0
    probe = b.acquire()
    b.release(probe)
    assert b.acquire() is True


def test_state_changes_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    b = breaker(clock)
    with caplog.at_level(logging.INFO, logger="tritonforge.client.breaker"):
        fail(b, 3)
        clock.now += 5.0
        b.record(b.acquire(), ok=True)
    text = caplog.text
    assert f"circuit for {SERVER} open" in text
    assert "half-open" in text and "closed" in text


def test_zero_threshold_turns_it_off() -> None:
    b = CircuitBreaker(SERVER, BreakerPolicy(0), FakeClock())
    fail(b, 50)
    assert b.state == CLOSED and b.acquire() is False
    with pytest.raises(ValueError, match="failure_threshold"):
        BreakerPolicy(-1)


def test_settings_give_every_client_a_breaker_on_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("BREAKER_FAILURES", "BREAKER_WINDOW_S", "BREAKER_COOLDOWN_S", "URL"):
        monkeypatch.delenv(f"TRITONFORGE_{name}", raising=False)
    settings = ClientSettings(url="h:1")
    b = settings.circuit_breaker()
    assert b.policy == BreakerPolicy() and b.policy.enabled and b.server == "http://h:1"
    monkeypatch.setenv("TRITONFORGE_BREAKER_FAILURES", "0")
    assert not ClientSettings(url="h:1").circuit_breaker().policy.enabled
    monkeypatch.setenv("TRITONFORGE_BREAKER_COOLDOWN_S", "0")
    with pytest.raises(InvalidRequestError, match="circuit breaker"):
        ClientSettings(url="h:1")


def unavailable() -> InferenceServerException:
    return InferenceServerException(msg="Exceeds maximum queue size", status="503")


def test_retry_loop_stops_when_the_breaker_opens_and_then_fails_fast() -> None:
    clock = FakeClock()
    b = breaker(clock)
    calls = 0

    def fn(_remaining_s: float) -> str:
        nonlocal calls
        calls += 1
        raise unavailable()

    policy = RetryPolicy(max_attempts=10, deadline_s=60.0)
    with pytest.raises(ServerUnavailableError, match=r"circuit for http://inference\S+ opened"):
        call_with_retry(fn, policy, "ctx", breaker=b, sleep=clock.sleep, clock=clock)
    assert calls == 3  # the threshold, not max_attempts
    with pytest.raises(CircuitOpenError):
        call_with_retry(fn, policy, "ctx", breaker=b, sleep=clock.sleep, clock=clock)
    assert calls == 3  # failed fast: the server saw nothing


def test_no_retry_storm_many_callers_send_one_probe_per_cooldown() -> None:
    """100 calls, each with retries, against a server that keeps failing: after the breaker
    opens the server sees one request per cool-down."""
    clock = FakeClock()
    b = breaker(clock)
    sent: list[float] = []

    def fn(_remaining_s: float) -> str:
        sent.append(clock.now)
        raise unavailable()

    policy = RetryPolicy(max_attempts=4, deadline_s=60.0)
    for _ in range(100):
        with contextlib.suppress(ServerUnavailableError):
            call_with_retry(fn, policy, "ctx", breaker=b, sleep=clock.sleep, clock=clock)
        clock.now += 0.25  # a caller every 250 ms: 25 s in all
    opened = sent[2]
    after = [t for t in sent if t > opened]
    # one probe per 5 s cool-down, no more
    assert 3 <= len(after) <= (clock.now - opened) // 5.0 + 1
    assert all(b2 - a >= 5.0 for a, b2 in itertools.pairwise(after))


def test_caller_errors_prove_the_server_answers() -> None:
    clock = FakeClock()
    b = breaker(clock)
    fail(b, 2)

    def bad(_remaining_s: float) -> str:
        raise InferenceServerException(msg="unknown input", status="400")

    with pytest.raises(InvalidRequestError):
        call_with_retry(bad, RetryPolicy(), "ctx", breaker=b, sleep=clock.sleep, clock=clock)
    fail(b, 2)
    assert b.state == CLOSED  # the 400 reset the count


def test_async_retry_loop_uses_the_breaker_too() -> None:
    clock = FakeClock()
    b = breaker(clock, failures=2)
    calls = 0

    async def fn(_remaining_s: float) -> str:
        nonlocal calls
        calls += 1
        raise OSError("connection refused")

    async def main() -> None:
        policy = RetryPolicy(max_attempts=5, initial_backoff_s=0.001, max_backoff_s=0.001)
        with pytest.raises(ConnectionFailedError, match="opened"):
            await call_with_retry_async(fn, policy, "ctx", breaker=b, clock=clock)
        with pytest.raises(CircuitOpenError):
            await call_with_retry_async(fn, policy, "ctx", breaker=b, clock=clock)

    asyncio.run(main())
    assert calls == 2


def test_generation_stream_reports_to_the_breaker(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    b = breaker(clock, failures=2)
    client = generate.GenerateClient(url="h:1", protocol="http", breaker=b)
    outcomes: list[str] = []

    def source(*_args: object) -> Iterator[generate.Chunk]:
        if outcomes and outcomes[-1] == "fail":
            raise ServerUnavailableError("generate: overloaded; retry later")
        yield generate.Chunk("hi", "stop")

    monkeypatch.setattr(client, "_http", source)
    assert [c.text for c in client.stream("p")] == ["hi"]
    outcomes.append("fail")
    for _ in range(2):
        with pytest.raises(ServerUnavailableError, match="overloaded"):
            list(client.stream("p"))
    assert b.state == OPEN
    with pytest.raises(CircuitOpenError):
        list(client.stream("p"))
    clock.now += 5.0
    outcomes.append("ok")
    assert [c.text for c in client.stream("p")] == ["hi"]  # the probe closes it
    assert b.state == CLOSED
