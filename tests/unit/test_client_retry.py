"""Retry policy and error translation of the client (pure functions, fake callables)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from tritonclient.utils import InferenceServerException

from tritonforge.client.discovery import route
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
from tritonforge.client.retry import RetryPolicy, call_with_retry, call_with_retry_async, translate
from tritonforge.client.retry import log as retry_log
from tritonforge.client.settings import ClientSettings, normalize_url


class FakeClock:
    """Time that only moves when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def failing(
    errors: list[BaseException], result: str = "ok"
) -> tuple[Callable[[float], str], list[float]]:
    """A callable raising ``errors`` in turn, then returning ``result``; records its arguments."""
    calls: list[float] = []

    def fn(remaining_s: float) -> str:
        calls.append(remaining_s)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return result

    return fn, calls


def ise(status: str | None, msg: str = "boom") -> InferenceServerException:
    return InferenceServerException(msg=msg, status=status)


@pytest.mark.parametrize(
    ("exc", "expected", "transient"),
    [
        (ise("400", "unexpected shape"), InvalidRequestError, False),
        (ise("422"), InvalidRequestError, False),
        (ise("404", "unknown model"), ModelNotFoundError, False),
        (ise("503", "model not ready"), ServerUnavailableError, True),
        (ise("500"), ServerError, False),
        (ise("504"), DeadlineExceededError, False),
        (ise("StatusCode.INVALID_ARGUMENT", "bad input"), InvalidRequestError, False),
        (ise("StatusCode.NOT_FOUND"), ModelNotFoundError, False),
        (
            ise("StatusCode.UNAVAILABLE", "Request for unknown model: busy"),
            ServerUnavailableError,
            True,
        ),
        (
            ise("StatusCode.UNAVAILABLE", "This API is restricted, expecting header 'x'"),
            InvalidRequestError,
            False,
        ),
        (
            ise("StatusCode.UNAVAILABLE", "failed to connect to all addresses; Connection refused"),
            ConnectionFailedError,
            True,
        ),
        # a refusal for overload is typed, so a caller can degrade (#24); still transient
        (ise("503", "[request id: 7] Exceeds maximum queue size"), OverloadedError, True),
        (
            ise("StatusCode.UNAVAILABLE", "[request id: <id_unknown>] Request timeout expired"),
            OverloadedError,
            True,
        ),
        (ise("StatusCode.DEADLINE_EXCEEDED", "Deadline Exceeded"), DeadlineExceededError, False),
        (ise("StatusCode.INTERNAL"), ServerError, False),
        (ise(None, "unexpected datatype"), ClientError, False),
        (ConnectionRefusedError(111, "Connection refused"), ConnectionFailedError, True),
        (TimeoutError("timed out"), DeadlineExceededError, False),
        (ValueError("odd"), ClientError, False),
    ],
)
def test_translate_maps_status_to_class_and_transience(
    exc: BaseException, expected: type[ClientError], transient: bool
) -> None:
    err = translate(exc, "model 'embed' at http://h:1 (timeout 2 s)")
    assert type(err) is expected
    assert err.transient is transient
    assert "model 'embed'" in str(err) and "timeout 2 s" in str(err)


def test_translate_gevent_timeout_is_deadline() -> None:
    import gevent

    assert isinstance(translate(gevent.Timeout(1), "ctx"), DeadlineExceededError)


def test_translate_aiohttp_connection_error_is_connection_failed() -> None:
    import aiohttp

    err = translate(aiohttp.ServerDisconnectedError(), "ctx")
    assert isinstance(err, ConnectionFailedError)


def test_backoff_grows_exponentially_within_jitter_bounds() -> None:
    policy = RetryPolicy(initial_backoff_s=0.1, multiplier=2.0, max_backoff_s=1.0, jitter=0.5)
    assert [policy.backoff_s(n, lambda: 0.0) for n in (1, 2, 3, 4, 5)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 1.0]
    )
    assert [policy.backoff_s(n, lambda: 0.999999) for n in (1, 2, 5)] == pytest.approx(
        [0.05, 0.1, 0.5], rel=1e-5
    )


def test_no_jitter_is_deterministic_and_full_jitter_can_reach_zero() -> None:
    assert RetryPolicy(jitter=0.0).backoff_s(3, lambda: 0.7) == pytest.approx(0.2)
    assert RetryPolicy(jitter=1.0).backoff_s(3, lambda: 1.0) == pytest.approx(0.0)


@pytest.mark.parametrize(
    "kwargs", [{"max_attempts": 0}, {"jitter": 1.5}, {"deadline_s": 0}, {"multiplier": 0.5}]
)
def test_policy_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_transient_failures_are_retried_with_backoff_then_succeed() -> None:
    clock = FakeClock()
    fn, calls = failing([ise("503"), ise("StatusCode.UNAVAILABLE", "warming up")])
    policy = RetryPolicy(max_attempts=5, initial_backoff_s=0.1, jitter=0.0, deadline_s=10)
    assert call_with_retry(fn, policy, "ctx", sleep=clock.sleep, clock=clock) == "ok"
    assert len(calls) == 3
    assert clock.sleeps == pytest.approx([0.1, 0.2])
    # each attempt is told the time left to the overall deadline
    assert calls == pytest.approx([10.0, 9.9, 9.7])


@pytest.mark.parametrize(
    "exc", [ise("400"), ise("404"), ise("StatusCode.INVALID_ARGUMENT"), ise("500"), TimeoutError()]
)
def test_permanent_failures_are_not_retried(exc: BaseException) -> None:
    clock = FakeClock()
    fn, calls = failing([exc])
    with pytest.raises(ClientError) as info:
        call_with_retry(fn, RetryPolicy(max_attempts=5), "ctx", sleep=clock.sleep, clock=clock)
    assert len(calls) == 1 and info.value.attempts == 1
    assert clock.sleeps == []
    assert info.value.__cause__ is exc


def test_max_attempts_bounds_retries() -> None:
    clock = FakeClock()
    fn, calls = failing([ConnectionRefusedError()] * 10)
    policy = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, deadline_s=100)
    with pytest.raises(ConnectionFailedError) as info:
        call_with_retry(fn, policy, "ctx", sleep=clock.sleep, clock=clock)
    assert len(calls) == 3 and info.value.attempts == 3
    assert "max_attempts 3" in str(info.value)


def test_deadline_bounds_retries() -> None:
    clock = FakeClock()
    fn, calls = failing([ise("503")] * 100)
    policy = RetryPolicy(max_attempts=100, initial_backoff_s=0.1, jitter=0.0, deadline_s=1.0)
    with pytest.raises(ServerUnavailableError) as info:
        call_with_retry(fn, policy, "ctx", sleep=clock.sleep, clock=clock)
    # sleeps 0.1 + 0.2 + 0.4 = 0.7; the next (0.8) would cross the 1.0 s deadline
    assert len(calls) == 4 and info.value.attempts == 4
    assert clock.now < 1.0
    assert "deadline 1 s" in str(info.value)


def test_keyboard_interrupt_is_never_swallowed() -> None:
    fn, calls = failing([KeyboardInterrupt()])
    with pytest.raises(KeyboardInterrupt):
        call_with_retry(fn, RetryPolicy(), "ctx", sleep=lambda s: None)
    assert len(calls) == 1


def test_async_retry_follows_the_same_policy() -> None:
    attempts: list[float] = []

    async def fn(remaining_s: float) -> str:
        attempts.append(remaining_s)
        if len(attempts) < 3:
            raise ise("503")
        return "ok"

    policy = RetryPolicy(max_attempts=5, initial_backoff_s=0.001, deadline_s=5)
    assert asyncio.run(call_with_retry_async(fn, policy, "ctx")) == "ok"
    assert len(attempts) == 3

    async def bad(remaining_s: float) -> str:
        attempts.append(remaining_s)
        raise ise("StatusCode.INVALID_ARGUMENT")

    attempts.clear()
    with pytest.raises(InvalidRequestError):
        asyncio.run(call_with_retry_async(bad, policy, "ctx"))
    assert len(attempts) == 1


def test_routes_follow_the_discovered_pipeline() -> None:
    from tritonforge.pipelines import Output, Pipeline

    embed = Pipeline(
        name="embed",
        task="embedding",
        ensembles={"fp32": "embed", "int8": "embed_int8", "torchscript": "embed_torchscript"},
        bls="embed_bls",
        bls_variants=("fp32", "int8"),
        input="text",
        outputs=(Output("embedding", "FP32", (384,)),),
    )
    assert route(embed, "ensemble", "fp32") == ("embed", {})
    assert route(embed, "ensemble", "int8") == ("embed_int8", {})
    assert route(embed, "ensemble", "torchscript") == ("embed_torchscript", {})
    assert route(embed, "bls", "int8") == ("embed_bls", {"variant": "int8"})
    with pytest.raises(InvalidRequestError, match=r"unknown variant='fp16'.*'fp32', 'int8'"):
        route(embed, "ensemble", "fp16")
    with pytest.raises(InvalidRequestError, match="unknown variant='torchscript' for 'embed_bls'"):
        route(embed, "bls", "torchscript")  # exported, but not a BLS target
    with pytest.raises(InvalidRequestError, match=r"unknown route='graph' \(old name: pipeline=\)"):
        route(embed, "graph", "fp32")


def test_settings_come_from_env_and_arguments_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITONFORGE_PROTOCOL", "grpc")
    monkeypatch.delenv("TRITONFORGE_URL", raising=False)
    monkeypatch.setenv("TRITONFORGE_TIMEOUT_S", "2.5")
    s = ClientSettings()
    assert (s.protocol, s.address, s.timeout_s) == ("grpc", "localhost:8001", 2.5)
    monkeypatch.setenv("TRITONFORGE_URL", "http://example:9000/")
    assert ClientSettings(protocol="http").address == "example:9000"
    assert ClientSettings(url="grpc://h:1").address == "h:1"
    with pytest.raises(InvalidRequestError):
        ClientSettings(protocol="ftp")
    assert normalize_url("https://a:1") == "a:1"


def test_each_retry_is_logged_with_the_attempt_error_and_delay(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    fn, _ = failing([ise("503", "warming up")])
    policy = RetryPolicy(max_attempts=3, initial_backoff_s=0.25, jitter=0.0, deadline_s=10)
    with caplog.at_level("WARNING", logger=retry_log.name):
        call_with_retry(fn, policy, "model 'embed' at http://h:1", sleep=clock.sleep, clock=clock)
    (record,) = caplog.records
    message = record.getMessage()
    assert "attempt 1/3" in message and "ServerUnavailableError" in message
    assert "warming up" in message and "retrying in 0.25 s" in message
    caplog.clear()
    fn, _ = failing([ise("400")])
    with caplog.at_level("WARNING", logger=retry_log.name), pytest.raises(InvalidRequestError):
        call_with_retry(fn, policy, "ctx", sleep=clock.sleep, clock=clock)
    assert caplog.records == []
