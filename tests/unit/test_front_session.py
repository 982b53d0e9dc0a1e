"""The stream session's lifecycle (runtime.front.session): the slot is taken on entry and released
exactly once on every end (normal, client gone, upstream error, timeout, task cancelled, ended by
the front); the tenant's priority goes on the request, a client's is refused; and a new stream
kind (a relay written here, touching no other module) gets admission, the timeout and the release
from the session alone."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest
from tritonclient.grpc import service_pb2

from tritonforge.generation import QUEUE_PRIORITY_PARAMETER
from tritonforge.runtime.errors import FrontError
from tritonforge.runtime.front.guard import Admission
from tritonforge.runtime.front.session import (
    StreamRefusedError,
    StreamSession,
    prioritized_body,
)

MODEL = "generate"


def response(text: str, final: bool = False) -> service_pb2.ModelStreamInferResponse:
    message = service_pb2.ModelStreamInferResponse()
    message.infer_response.model_name = MODEL
    if final:
        message.infer_response.parameters["triton_final_response"].bool_param = True
    message.infer_response.id = text
    return message


class FakeCall:
    """A ``grpc.aio`` stream call: reads come from ``script`` (a message, an exception to raise,
    or ``None`` to hang until cancelled); records how it was ended."""

    def __init__(self, *script: Any) -> None:
        self.script = list(script)
        self.cancels = 0
        self.closed = False
        self._cancelled = asyncio.Event()

    async def read(self) -> Any:
        step = self.script.pop(0) if self.script else None
        if isinstance(step, BaseException):
            raise step
        if step is None:
            await self._cancelled.wait()
            raise asyncio.CancelledError
        return step

    def cancel(self) -> bool:
        if self.done():
            return False
        self.cancels += 1
        self._cancelled.set()
        return True

    def done(self) -> bool:
        return self._cancelled.is_set() or self.closed

    async def code(self) -> grpc.StatusCode:
        self.closed = True  # half-closed after its final response: the upstream closes it
        return grpc.StatusCode.OK


class Charges:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def __call__(self, prompt: int, completion: int) -> None:
        self.calls.append((prompt, completion))


async def line_relay(
    admission: Admission, call: FakeCall, timeout_s: float, charge: Charges
) -> str:
    """A new stream kind, written here and nowhere else: plain text lines. Everything but the
    wire format (slot, timeout, end, release, charge) is the session's."""
    lines: list[str] = []
    try:
        async with StreamSession(admission, MODEL, timeout_s, charge=charge) as session:
            session.attach(call)
            while (message := await session.read()) is not None:
                lines.append(message.infer_response.id)
                if session.answered:
                    break
            session.note_usage(3, len(lines))
    except StreamRefusedError as e:
        return f"refused: {e}"
    except TimeoutError:
        return "timed out"
    return "\n".join(lines)


def run(coro: Any) -> Any:
    """``coro``'s result, once the calls it left to close have closed."""

    async def settled() -> Any:
        result = await coro
        await asyncio.sleep(0.01)
        return result

    return asyncio.run(settled())


def test_a_new_stream_kind_gets_its_lifecycle_from_the_session() -> None:
    admission, charge = Admission(max_open_streams=1), Charges()
    call = FakeCall(response("a"), response("b c d"), response("", final=True))
    assert run(line_relay(admission, call, 5.0, charge)) == "a\nb c d\n"
    assert admission.idle() and charge.calls == [(3, 3)]
    assert call.cancels == 0  # answered: left to close, never cancelled mid-request

    async def full() -> str:  # the bound holds for the new kind too
        async with StreamSession(admission, MODEL, 5.0):
            return await line_relay(admission, FakeCall(), 5.0, Charges())

    assert run(full()).startswith(f"refused: {MODEL}: overloaded")
    assert admission.idle()
    assert run(line_relay(admission, FakeCall(None), 0.05, charge)) == "timed out"
    assert admission.idle() and charge.calls[-1] == (0, 0)


def test_released_once_on_upstream_error() -> None:
    admission, charge = Admission(4), Charges()
    error = grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None, "gone")
    call = FakeCall(response("a"), error)

    async def relay() -> None:
        async with StreamSession(admission, MODEL, 5.0, charge=charge) as session:
            session.attach(call)
            assert admission.holding(MODEL) == 1
            await session.read()
            await session.read()

    with pytest.raises(grpc.aio.AioRpcError):
        run(relay())
    assert admission.idle() and charge.calls == [(0, 0)] and call.cancels == 1


def test_released_once_when_the_client_leaves_or_the_task_is_cancelled() -> None:
    admission, charge = Admission(4), Charges()
    call = FakeCall(response("a"), None)

    async def relay(started: asyncio.Event) -> None:
        async with StreamSession(admission, MODEL, 60.0, charge=charge) as session:
            session.attach(call)
            await session.read()
            started.set()
            await session.read()

    async def main() -> None:
        started = asyncio.Event()
        task = asyncio.create_task(relay(started))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main())
    assert admission.idle() and charge.calls == [(0, 0)] and call.cancels >= 1

    gone = FakeCall(response("a"))

    async def left() -> None:
        async with StreamSession(admission, MODEL, 60.0, charge=charge) as session:
            session.attach(gone)
            await session.read()
            session.client_left()
            session.close()  # a second end changes nothing
            assert admission.idle()

    run(left())
    assert gone.cancels == 1 and charge.calls[-1] == (0, 0) and len(charge.calls) == 2


def test_ended_by_the_front_says_why() -> None:
    admission = Admission(4)
    call = FakeCall(None)

    async def relay() -> str | None:
        async with StreamSession(admission, MODEL, 60.0) as session:
            session.attach(call)
            reading = asyncio.create_task(session.read())
            await asyncio.sleep(0)
            assert admission.end_streams([MODEL], "draining") == 1
            with pytest.raises(asyncio.CancelledError):
                await reading
            return session.reason

    assert run(relay()) == "draining"
    assert admission.idle()


def test_a_non_streamed_request_is_tracked_not_bounded() -> None:
    admission = Admission(1)

    async def two() -> int:
        async with (
            StreamSession(admission, MODEL, 1.0),
            StreamSession(admission, MODEL, 1.0, slot=False),
        ):
            return admission.open_streams + len(admission._streams)

    assert run(two()) == 1 + 2
    assert admission.idle()


def test_priority_is_the_tenants_and_a_client_priority_is_refused() -> None:
    admission = Admission(4)
    session = StreamSession(admission, MODEL, 1.0, priority=2)
    message = service_pb2.ModelInferRequest(model_name=MODEL)
    session.prioritize(message)
    assert message.parameters[QUEUE_PRIORITY_PARAMETER].int64_param == 2
    with pytest.raises(FrontError, match=QUEUE_PRIORITY_PARAMETER) as refused:
        session.prioritize(message)  # now it carries one, as a forged request would
    assert refused.value.status == 400


def test_capacity_is_read_before_the_slot() -> None:
    admission, read = Admission(8), []

    async def capacity(model: str) -> None:
        read.append(model)
        admission.capacities[model] = 1

    async def two() -> None:
        async with (
            StreamSession(admission, MODEL, 1.0, capacity=capacity),
            StreamSession(admission, MODEL, 1.0, capacity=capacity),
        ):
            pass

    with pytest.raises(StreamRefusedError, match="its bound is 1"):
        run(two())
    assert read == [MODEL, MODEL] and admission.idle()


def test_non_streamed_bodies_carry_the_tenants_priority_and_refuse_a_clients() -> None:
    infer = json.dumps({"inputs": [], "parameters": {"x": 1}}).encode()
    body, length = prioritized_body(False, infer, None, 2)
    assert json.loads(body)["parameters"] == {"x": 1, QUEUE_PRIORITY_PARAMETER: 2}
    assert length is None
    binary = infer + b"\x00\x01"
    body, length = prioritized_body(False, binary, str(len(infer)), 3)
    assert length is not None and body.endswith(b"\x00\x01")
    assert json.loads(body[: int(length)])["parameters"][QUEUE_PRIORITY_PARAMETER] == 3
    assert prioritized_body(False, infer, None, None) == (infer, None)  # no tenants: as it came
    generate = json.dumps({"text_input": "hi", "max_tokens": 4}).encode()
    body, _ = prioritized_body(True, generate, None, 1)
    assert json.loads(body)[QUEUE_PRIORITY_PARAMETER] == 1
    forged = [
        (False, {"inputs": [], "parameters": {QUEUE_PRIORITY_PARAMETER: 1}}),
        (True, {"text_input": "hi", QUEUE_PRIORITY_PARAMETER: 1}),
        (True, {"text_input": "hi", "parameters": {QUEUE_PRIORITY_PARAMETER: 1}}),
    ]
    for generate_kind, doc in forged:
        for priority in (None, 5):
            with pytest.raises(FrontError, match=QUEUE_PRIORITY_PARAMETER) as refused:
                prioritized_body(generate_kind, json.dumps(doc).encode(), None, priority)
            assert refused.value.status == 400


def test_a_client_priority_spelt_with_escapes_is_refused_too() -> None:
    escaped = b'{"inputs": [], "parameters": {"queue\\u005fpriority": 1}}'
    assert json.loads(escaped)["parameters"] == {QUEUE_PRIORITY_PARAMETER: 1}
    with pytest.raises(FrontError, match=QUEUE_PRIORITY_PARAMETER):
        prioritized_body(False, escaped, None, None)
    plain = b'{"inputs": [], "parameters": {"x": 1}}'
    assert prioritized_body(False, plain, None, None) == (plain, None)
