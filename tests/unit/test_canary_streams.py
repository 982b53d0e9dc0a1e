"""How the supervisor's stream canary ends its gRPC stream (issue #19 finding 5): gracefully once
the final response came, cancelled only when it did not. Triton 2.51's gRPC handler can leak the
state of a stream cancelled around its request's completion; that state holds the model, which
then never unloads, and tritonserver waited out its 30 s exit timeout at shutdown and exited 1.
A fake tritonclient stands in for Triton here; the integration test is
``tests/integration/test_availability_front.py::test_sigterm_under_16_clients_*``."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import tritonclient.grpc as grpcclient

from tritonforge.runtime.supervisor import canaries


class FakeStream:
    """tritonclient's ``_InferStream``: a request queue and the thread reading the responses,
    which ends once the server finished the call (``finishes``: after the half-close)."""

    def __init__(self, finishes: bool) -> None:
        self._request_queue: queue.Queue[object] = queue.Queue()
        self.cancelled = threading.Event()

        def read() -> None:
            while True:
                if self._request_queue.get() is None and finishes:
                    return  # the server saw the half-close and finished the call with OK
                if self.cancelled.is_set():
                    return

        self._handler = threading.Thread(target=read, daemon=True)
        self._handler.start()


class FakeClient:
    """Records how the stream ended; answers ``async_stream_infer`` as told."""

    instances: ClassVar[list[FakeClient]] = []
    answer: ClassVar[str] = "final"  # final | nothing | error
    finishes: ClassVar[bool] = True

    def __init__(self, url: str) -> None:
        self.calls: list[str] = []
        self._stream: FakeStream | None = None
        self.callback: Callable[..., None] | None = None
        FakeClient.instances.append(self)

    def start_stream(self, callback: Callable[..., None]) -> None:
        self.callback = callback
        self._stream = FakeStream(FakeClient.finishes)

    def async_stream_infer(self, model: str, inputs: list[Any], **kwargs: Any) -> None:
        assert self.callback is not None
        if FakeClient.answer == "final":
            flag = SimpleNamespace(bool_param=True)
            result = SimpleNamespace(
                get_response=lambda: SimpleNamespace(parameters={"triton_final_response": flag})
            )
            self.callback(result=result, error=None)
        elif FakeClient.answer == "error":
            self.callback(result=None, error=RuntimeError("UNAVAILABLE: busy"))

    def stop_stream(self, cancel_requests: bool = False) -> None:
        self.calls.append(f"stop_stream(cancel_requests={cancel_requests})")
        if self._stream is not None and cancel_requests:
            self._stream.cancelled.set()
        self._stream = None

    def close(self) -> None:
        self.calls.append("close")


@pytest.fixture
def fake_client(monkeypatch: pytest.MonkeyPatch) -> type[FakeClient]:
    FakeClient.instances, FakeClient.answer, FakeClient.finishes = [], "final", True
    monkeypatch.setattr(grpcclient, "InferenceServerClient", FakeClient)
    return FakeClient


def test_a_canary_that_got_its_final_response_ends_its_stream_without_a_cancel(
    fake_client: type[FakeClient],
) -> None:
    canaries.stream_canary("unix:/x", "generate", [], timeout_s=5)
    (client,) = fake_client.instances
    assert client.calls == ["stop_stream(cancel_requests=False)", "close"]


@pytest.mark.parametrize("answer", ["nothing", "error"])
def test_a_canary_without_its_final_response_cancels_its_stream(
    fake_client: type[FakeClient], answer: str
) -> None:
    fake_client.answer = answer
    with pytest.raises((TimeoutError, RuntimeError)):
        canaries.stream_canary("unix:/x", "generate", [], timeout_s=0.2)
    (client,) = fake_client.instances
    assert client.calls == ["stop_stream(cancel_requests=True)", "close"]


def test_end_stream_cancels_a_call_the_server_does_not_finish_in_time(
    fake_client: type[FakeClient],
) -> None:
    fake_client.finishes = False
    client = FakeClient("unix:/x")
    client.start_stream(lambda **_: None)
    stream = client._stream
    assert stream is not None
    assert canaries.end_stream(client, timeout_s=0.2) is False
    assert client.calls == ["stop_stream(cancel_requests=True)"]
    stream._handler.join(timeout=5)
    assert not stream._handler.is_alive()  # the reading thread ended too: no thread leak


def test_a_canary_round_skips_the_models_left_once_the_supervisor_stops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A shutdown stops the supervisor first and waits for its threads: a round of canaries
    (each bounded by the canary timeout, slow on a loaded machine) must not run to its end."""
    import threading

    from tritonforge.modelconfig import ModelConfig

    stop = threading.Event()
    asked: list[str] = []

    class Client:
        def __init__(self, url: str) -> None:
            pass

        def infer(self, model: str, inputs: list[Any], client_timeout: float) -> None:
            asked.append(model)
            stop.set()  # the supervisor is told to stop during the first canary

        def close(self) -> None:
            pass

    monkeypatch.setattr(grpcclient, "InferenceServerClient", Client)
    config = {
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}],
        "max_batch_size": 0,
    }
    configs = {name: ModelConfig.from_json({"name": name, **config}) for name in ("a", "b", "c")}
    results = canaries.canary_round("unix:/x", configs, timeout_s=5, cancel=stop)
    assert asked == ["a"] and results == {"a": canaries.OK}


@pytest.mark.parametrize(
    ("cancel_after_first", "ended"),
    [(False, "stop_stream(cancel_requests=False)"), (True, "stop_stream(cancel_requests=True)")],
)
def test_the_chaos_stream_probe_cancels_only_the_streams_it_means_to_cancel(
    fake_client: type[FakeClient], cancel_after_first: bool, ended: str
) -> None:
    """The chaos run's gRPC probe: a stream read to its final response ends gracefully (through
    the front, a cancel there is passed on to Triton); its fault streams are still cancelled."""
    from tritonforge.loadtest.reliability.chaos import probes

    kind, _ = probes.stream_once(
        "unix:/x", "generate", [], max_tokens=1, timeout_s=5, cancel_after_first=cancel_after_first
    )
    assert kind == probes.OK
    (client,) = fake_client.instances
    assert client.calls == [ended, "close"]
