"""The v2 ``generate_stream`` relay: an SSE stream the front serves over Triton's gRPC
(:mod:`runtime.front.sse`: Triton's request mapping and wire format), holding one of its model's
stream slots (:class:`~runtime.front.guard.Admission`), and the refusals written as Triton's HTTP
endpoint writes them."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import aiohttp
import grpc
from aiohttp import web

from tritonforge.errors import shown
from tritonforge.runtime.errors import FrontError
from tritonforge.runtime.front import sse as front_sse
from tritonforge.runtime.front import stream as front_stream
from tritonforge.runtime.front.grpc import TRACEPARENT_KEY
from tritonforge.runtime.front.guard import (
    QUEUE_PRIORITY_KEY,
    TENANT_KEY,
    VERSION_HEADER,
    Admission,
    parse_version,
)
from tritonforge.runtime.front.session import StreamRefusedError, StreamSession

if TYPE_CHECKING:
    from tritonforge.runtime.front.http import HttpFront

# Triton's messages of a model that is not there (while draining: a 503, not a 404)
DRAIN_NOT_FOUND = ("has no available versions", "unknown model", "is not found")


def model_and_version(path: str) -> tuple[str, str]:
    """``(model, version)`` of a ``/v2/models/<name>[/versions/<v>]/...`` path ("" when none)."""
    parts = path.split("/")
    version = parts[5] if len(parts) > 6 and parts[4] == "versions" else ""
    return parts[3], version


async def forward_stream(
    front: HttpFront, request: web.BaseRequest, headers: dict[str, str], body: bytes
) -> web.StreamResponse:
    """A ``generate_stream`` SSE stream, served by the front itself over Triton's gRPC
    (:mod:`runtime.front.sse`: Triton's request mapping and wire format), holding one of its
    model's stream slots (:class:`Admission`): no Triton HTTP thread and no short-request
    connection is held while it streams. A client that goes away cancels the gRPC call at
    once (Triton cancels the request, the decode loop frees its slot at the next step); on
    drain or :meth:`Admission.end_streams` the stream ends with an ``error`` event saying
    why."""
    model, version = model_and_version(request.path)
    if request.method != "POST":
        return web.json_response({"error": "Method Not Allowed"}, status=405)
    if front.grpc_channel is None:
        return unavailable("generate_stream needs the front's gRPC upstream")
    session = StreamSession(
        front.admission,
        model,
        front.limits.request_timeout_s,
        capacity=front.stream_capacity,
        priority=request.get(QUEUE_PRIORITY_KEY),
        tenant=request.get(TENANT_KEY),
    )
    try:
        async with session:
            version = await stream_version(front, request, model, version)
            channel = front.grpc_channel()
            try:
                inputs = await front_stream.model_inputs(
                    channel, model, version, front.limits.queue_timeout_s
                )
            except grpc.aio.AioRpcError as e:
                return grpc_refusal(e, front.admission)
            try:
                message = front_sse.infer_request(model, version, json_body(body), inputs)
                trace = [(k.lower(), v) for k, v in headers.items() if k.lower() == TRACEPARENT_KEY]
                session.start(channel, message, trace)
            except FrontError as e:
                return triton_error(e.status, str(e))
            return await relay_sse(request, session, front.admission)
    except StreamRefusedError as e:  # no slot: the session never opened
        return unavailable(str(e))


async def stream_version(
    front: HttpFront, request: web.BaseRequest, model: str, version: str
) -> str:
    """The version to stream from: the path's, else an ``X-Model-Version`` the model can
    pin (400 where it cannot, as on ``/infer``)."""
    pinned = request.headers.get(VERSION_HEADER)
    if pinned is None:
        return version
    parse_version(pinned, VERSION_HEADER)
    await front.check_pin(model, VERSION_HEADER)
    return version or pinned.strip()


def grpc_refusal(e: grpc.aio.AioRpcError, admission: Admission) -> web.Response:
    """A refusal before the stream began, as Triton's HTTP endpoint answers it."""
    code, details = e.code(), e.details() or ""
    if code == grpc.StatusCode.UNAVAILABLE or code == grpc.StatusCode.DEADLINE_EXCEEDED:
        if code == grpc.StatusCode.DEADLINE_EXCEEDED or "connect" in details.lower():
            details = "tritonserver not reachable (restarting?)"
        return unavailable(details)
    if admission.draining is not None and any(m in details for m in DRAIN_NOT_FOUND):
        return unavailable(f"{admission.draining}; retry later")
    return triton_error(TRITON_HTTP_STATUS.get(code, 400), details)


async def relay_sse(
    request: web.BaseRequest, session: StreamSession, admission: Admission
) -> web.StreamResponse:
    """Write the session's responses as Triton's SSE events; the status is the first one's."""
    watcher = asyncio.get_running_loop().create_task(watch_client(request, session))
    response: web.StreamResponse | None = None
    try:
        while True:
            event, last = b"", False
            try:
                message = await session.read()
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                if client_gone(request):  # the watcher cancelled the call: nobody to tell
                    return response or web.Response(status=499)
                reason = session.reason or "the stream was cancelled"
                event, last = front_sse.error_event(f"{reason}: stream ended"), True
            except TimeoutError:
                silent = (
                    f"no output from tritonserver within request_timeout_s={session.timeout_s:g}"
                )
                if response is None:
                    return unavailable(silent)
                event, last = front_sse.error_event(f"{silent}: stream ended"), True
            except grpc.aio.AioRpcError as e:
                if response is None:
                    return grpc_refusal(e, admission)
                reason = session.reason or "tritonserver closed the stream (restarting?)"
                event, last = front_sse.error_event(f"{reason}: stream ended"), True
            else:
                if message is None:
                    break
                if message.error_message:
                    event = front_sse.error_event(message.error_message)
                else:
                    event = front_sse.response_event(message.infer_response) or b""
                    last = session.answered
            if response is None:
                if not event:
                    if last:
                        break
                    continue
                status = 200
                if event.startswith(b'data: {"error"'):
                    status = front_stream.in_stream_status(event.decode("utf-8", "replace"))
                    status = 400 if status == 499 else status
                headers = front_sse.stream_headers(status, event)
                response = web.StreamResponse(status=status, headers=headers)
                await response.prepare(request)
            if event:
                await response.write(event)
            if last:
                break
        if response is None:  # ended without a response: Triton answered an empty 200
            response = web.StreamResponse(
                status=200, headers={"Content-Type": front_sse.CONTENT_TYPE}
            )
            await response.prepare(request)
        await response.write_eof()
        return response
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        session.client_left()  # the client went away: free its slot now
        return response or web.Response(status=499)
    finally:
        watcher.cancel()


async def watch_client(
    request: web.BaseRequest, session: StreamSession, poll_s: float = 0.2
) -> None:
    """End the upstream gRPC ``call`` once the client's connection is gone, even while the
    stream is silent (queued): Triton then cancels the request and the decode loop drops it at
    its next step (:meth:`StreamSession.client_left`: not once it was answered)."""
    while not client_gone(request):
        await asyncio.sleep(poll_s)
    session.client_left()


def client_gone(request: web.BaseRequest) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


# Triton's HTTP status of an error before a stream began (its HttpCodeFromError)
TRITON_HTTP_STATUS = {
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.UNIMPLEMENTED: 501,
}


def triton_error(status: int, message: str) -> web.Response:
    """An error answered as Triton's HTTP endpoint writes it (compact JSON, its content type)."""
    return web.Response(
        status=status, body=front_sse.dumps({"error": message}), content_type="application/json"
    )


def json_body(body: bytes) -> Any:
    try:
        return json.loads(body or b"{}")
    except ValueError as e:
        raise FrontError(f"the generate request is not JSON: {shown(str(e))}", 400) from e


def unavailable(message: str) -> web.Response:
    return web.json_response({"error": message}, status=503, headers={"Retry-After": "1"})
