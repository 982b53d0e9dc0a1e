"""The front's gRPC relay: a ``grpc.aio`` handler forwarding raw messages to Triton's gRPC Unix
socket (no re-encoding), after the request checks (:mod:`runtime.front.body`) and the admin key
check on the restricted methods."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

import grpc
from tritonclient.grpc import service_pb2

from tritonforge.runtime.errors import FrontError
from tritonforge.runtime.front import stream_end
from tritonforge.runtime.front.body import check_infer_message
from tritonforge.runtime.front.guard import (
    VERSION_PARAMETER,
    Admission,
    ThrottledLog,
    admin_ok,
    check_model_name,
    set_cache_salt,
    set_queue_priority,
)
from tritonforge.runtime.front.queues import QueueFullError
from tritonforge.runtime.front.session import StreamRefusedError, StreamSession
from tritonforge.runtime.front.settings import FrontLimits
from tritonforge.runtime.front.stream import GRPC_SERVICE

if TYPE_CHECKING:
    from tritonforge.runtime.tenants.keys import Tenant

log = logging.getLogger(__name__)

GRPC_STREAMING = {f"{GRPC_SERVICE}ModelStreamInfer"}
TRACEPARENT_KEY = "traceparent"  # W3C trace context (gRPC metadata key)
_UPSTREAM_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
# The shared upstream channel: its own subchannel (gRPC's global pool would hand a refreshed
# channel the old one's connection, still in reconnect back-off after a restart: "tritonserver
# not reachable" after the supervisor reported the server back, found by test_launcher_lifecycle
# at load 30), and a back-off capped at 1 s on the local socket.
_SHARED_UPSTREAM_OPTIONS = [
    *_UPSTREAM_OPTIONS,
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
GRPC_INFER = f"{GRPC_SERVICE}ModelInfer"
GRPC_RESTRICTED = {
    GRPC_SERVICE + name
    for name in (
        "RepositoryIndex",
        "RepositoryModelLoad",
        "RepositoryModelUnload",
        "ModelConfig",
        "ModelStatistics",
        "SystemSharedMemoryStatus",
        "SystemSharedMemoryRegister",
        "SystemSharedMemoryUnregister",
        "CudaSharedMemoryStatus",
        "CudaSharedMemoryRegister",
        "CudaSharedMemoryUnregister",
        "TraceSetting",
        "LogSettings",
    )
}


async def _read(call: Any) -> Any:
    """The next message of ``call`` (``grpc.aio.EOF`` at its end). The read is shielded: grpc.aio
    cancels the whole call when a read is cancelled, and a client that leaves after its final
    response must not cancel the call (:mod:`~tritonforge.runtime.front.stream_end`); the finally
    of the stream decides."""
    read = asyncio.ensure_future(call.read())
    read.add_done_callback(_retrieved)
    return await asyncio.shield(read)


def _retrieved(read: asyncio.Future[Any]) -> None:
    """Mark an abandoned read's failure as seen (the stream's end already dealt with it)."""
    if not read.cancelled():
        read.exception()


async def _until(messages: AsyncIterator[bytes], done: asyncio.Event) -> AsyncIterator[bytes]:
    """``messages`` until they end, fail (the client cancelled) or ``done`` is set: then the
    upstream request stream is half-closed. (A request iterator that raises makes grpc.aio
    cancel the call, and one that never ends would keep it open.)"""
    iterator = aiter(messages)
    stop = asyncio.ensure_future(done.wait())
    try:
        while True:
            step = asyncio.ensure_future(anext(iterator))
            step.add_done_callback(_retrieved)  # a read left behind may fail: no warning
            await asyncio.wait({step, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                step.cancel()
                return
            try:
                message = step.result()
            except (StopAsyncIteration, asyncio.CancelledError, Exception):
                return
            yield message
    finally:
        stop.cancel()


def _goodbye(reason: str) -> bytes:
    """The last message of a gRPC stream ended by the front: an in-stream error saying why."""
    return service_pb2.ModelStreamInferResponse(
        error_message=f"{reason}: stream ended"
    ).SerializeToString()


class GrpcFront(grpc.GenericRpcHandler):
    """grpc.aio server forwarding raw messages to Triton's gRPC Unix socket (no re-encoding).

    Streams (``ModelStreamInfer``) hold a slot of each model they send a request to (its
    bound: :class:`Admission`; UNAVAILABLE naming the model past it); a client that cancels or
    whose deadline passes cancels the upstream call at once."""

    def __init__(
        self,
        upstream_target: Callable[[], str],
        admin_key: str | None,
        admin_headers: Iterable[str],
        limits: FrontLimits,
        admission: Admission | None = None,
        errors: ThrottledLog | None = None,
        pins: Callable[[str, str], Awaitable[None]] | None = None,
        traced: bool = False,
        served: Callable[[str], Awaitable[object]] | None = None,
        queues: Callable[[str], contextlib.AbstractAsyncContextManager[None]] | None = None,
    ) -> None:
        """``pins(model, field)`` raises :class:`FrontError` when ``model`` cannot pin;
        ``served(model)`` reads ``model``'s stream bound from its served config (once);
        ``async with queues(model)`` holds a ``ModelInfer``'s slot of each bounded queue of
        ``model`` (:class:`QueueFullError` when one is full: UNAVAILABLE naming it).
        ``traced``: tritonserver exports OpenTelemetry spans, so a unary call carrying a
        ``traceparent`` goes over a channel of its own (:meth:`unary_channel`)."""
        self.upstream_target = upstream_target
        self.admin_key = admin_key
        self.admin_headers = tuple(h.lower() for h in admin_headers)
        self.limits = limits
        self.admission = admission or Admission(limits.max_open_streams)
        self.errors = errors or ThrottledLog(log)
        self.pins = pins
        self.traced = traced
        self.served = served
        self.queues = queues
        self._channel: grpc.aio.Channel | None = None
        self._channel_target = ""
        # the tenants' gate (runtime.tenants.grpc.admit_call: the caller's tenant; None: no
        # tenants) and the metadata that never goes upstream
        self.admit: Callable[[Any], Awaitable[Tenant]] | None = None
        # the tenants' model check per request message (runtime.tenants.grpc.check_model)
        self.may_call: Callable[[Any, str], None] | None = None
        self.hidden = ("user-agent", *self.admin_headers)

    def channel(self) -> grpc.aio.Channel:
        target = self.upstream_target()
        if self._channel is None or self._channel_target != target:
            if self._channel is not None:
                asyncio.get_running_loop().create_task(self._channel.close())
            self._channel = grpc.aio.insecure_channel(target, options=_SHARED_UPSTREAM_OPTIONS)
            self._channel_target = target
        return self._channel

    @contextlib.asynccontextmanager
    async def unary_channel(
        self, metadata: tuple[tuple[str, str], ...]
    ) -> AsyncIterator[grpc.aio.Channel]:
        """The shared upstream channel, or, when tracing is on and the call carries a
        ``traceparent``, a channel opened for this call alone.

        Why: Triton 2.51 intermittently ignores the ``traceparent`` of calls multiplexed on one
        long-lived HTTP/2 connection (measured through the front: 5 of 30 gRPC calls exported
        under a fresh, parentless trace; 0 of 30 with a connection per client, 0 of 80 with a
        connection per traced call; HTTP never). Its gRPC carrier appears to read the metadata
        value past its end (a ``string_ref`` taken as a C string), which then fails the W3C
        length check depending on what follows in the connection's buffers. A fresh connection
        costs a Unix-socket connect per traced call, only while tracing is on."""
        if not (self.traced and any(k == TRACEPARENT_KEY for k, _ in metadata)):
            yield self.channel()
            return
        # A local subchannel pool: otherwise gRPC hands this channel the shared one's connection.
        options = [*_UPSTREAM_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
        channel = grpc.aio.insecure_channel(self.upstream_target(), options=options)
        try:
            yield channel
        finally:
            await channel.close()

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close(grace=None)

    def detach(self, grace_s: float) -> None:
        """Hand new calls a fresh channel; let the calls in flight on the current one (open
        streams) finish within ``grace_s`` before it is closed. Closing it at once cancelled
        every open stream when tritonserver was asked to drain."""
        old, self._channel = self._channel, None
        if old is not None:
            asyncio.get_running_loop().create_task(old.close(grace=grace_s))

    async def _abort(self, context: Any, code: grpc.StatusCode, details: str) -> None:
        if code not in (grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED):
            self.errors.record(f"grpc {code.name}", details)
        await context.abort(code, details)

    async def _refuse_when_draining(self, context: Any) -> None:
        if self.admission.draining is not None:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"{self.admission.draining}; retry on another replica",
            )

    async def _checked_message(
        self, message: bytes, context: Any, tenant: Tenant | None
    ) -> tuple[str, bytes]:
        """The model a request message goes to and the message to send upstream, once it passed
        the checks: the tenant's ``priority`` is put on it as ``queue_priority`` (the server's:
        a client-sent one is refused) and its name into the ``cache_salt`` parameter
        (:func:`~runtime.front.guard.set_cache_salt`)."""
        request = check_infer_message(message)
        check_model_name(request.model_name, "model_name")
        priority = None if tenant is None else tenant.priority
        set_queue_priority(request, priority)
        set_cache_salt(request, None if tenant is None else tenant.name)
        if self.may_call is not None:
            self.may_call(context, request.model_name)
        if VERSION_PARAMETER in request.parameters and self.pins is not None:
            await self.pins(request.model_name, f"request parameter {VERSION_PARAMETER!r}")
        if tenant is not None:  # its salt (and priority) are on it now
            message = request.SerializeToString()
        return str(request.model_name), message

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method
        if method in GRPC_STREAMING:

            async def stream(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
                # an async generator function: grpc.aio treats anything else as synchronous
                async with contextlib.aclosing(self._stream(method, requests, context)) as out:
                    async for response in out:
                        yield response

            return grpc.stream_stream_rpc_method_handler(stream)

        async def unary(request: bytes, context: Any) -> bytes:
            await self._refuse_when_draining(context)
            self.admission.short += 1
            try:
                return await self._unary(method, request, context)
            finally:
                self.admission.short -= 1

        return grpc.unary_unary_rpc_method_handler(unary)

    async def _stream(
        self, method: str, requests: AsyncIterator[bytes], context: Any
    ) -> AsyncGenerator[bytes, None]:
        """A ``ModelStreamInfer`` passthrough in a :class:`StreamSession` (slot, the models its
        messages name, the tenant's priority, the end); its responses are relayed as they come,
        with no per-response timeout (a client may keep a stream open between requests)."""
        await self._refuse_when_draining(context)
        metadata = await self._metadata(method, context)
        tenant = await self._tenant(method, context)
        session = StreamSession(
            self.admission, None, self.limits.request_timeout_s, capacity=self.served
        )
        relay = self._relay(method, requests, context, metadata, tenant, session)
        try:
            async with session, contextlib.aclosing(relay) as out:
                async for response in out:
                    yield response
        except StreamRefusedError as e:  # no slot: the session never opened
            await self._abort(context, grpc.StatusCode.UNAVAILABLE, str(e))

    async def _relay(
        self,
        method: str,
        requests: AsyncIterator[bytes],
        context: Any,
        metadata: tuple[tuple[str, str], ...],
        tenant: Tenant | None,
        session: StreamSession,
    ) -> AsyncGenerator[bytes, None]:
        bad: list[tuple[grpc.StatusCode, str]] = []
        # requests sent upstream and not yet finally answered: a client that leaves with none
        # gets its call closed, not cancelled (stream_end: Triton 2.51 leaks a cancel that
        # races a final response)
        open_requests = [0]
        client_done = asyncio.Event()

        async def checked() -> AsyncIterator[bytes]:
            async for message in _until(requests, client_done):
                try:
                    model, message = await self._checked_message(message, context, tenant)
                    await session.add_model(model)
                except FrontError as e:
                    bad.append((_status_code(e), str(e)))
                    if session.call is not None:
                        session.call.cancel()
                    return
                open_requests[0] += 1
                yield message

        call = session.attach(
            self.channel().stream_stream(method)(
                checked(), metadata=metadata, timeout=context.time_remaining()
            )
        )
        try:
            try:
                while (response := await _read(call)) is not grpc.aio.EOF:
                    if stream_end.final_in(response):
                        open_requests[0] -= 1
                    yield response
            except (grpc.aio.AioRpcError, asyncio.CancelledError) as e:
                if bad:
                    await self._abort(context, *bad[0])
                if session.reason is not None:
                    yield _goodbye(session.reason)
                    return
                if isinstance(e, asyncio.CancelledError):
                    raise
                await self._abort(context, e.code(), e.details() or "")
            if bad:
                await self._abort(context, *bad[0])
        finally:
            # a client that cancelled or timed out mid-request: Triton cancels the request; one
            # whose requests were all answered: its call is half-closed and left to close
            client_done.set()
            session.answered = not open_requests[0] and not bad
            session.close()

    async def _unary(self, method: str, request: bytes, context: Any) -> bytes:
        metadata = await self._metadata(method, context)
        model: str | None = None
        if method == GRPC_INFER:
            tenant = await self._tenant(method, context)
            try:
                model, request = await self._checked_message(request, context, tenant)
            except FrontError as e:
                await self._abort(context, _status_code(e), str(e))
        async with contextlib.AsyncExitStack() as slot:
            if model is not None and self.queues is not None:
                try:  # a slot of each bounded queue the model goes to (runtime.front.queues)
                    await slot.enter_async_context(self.queues(model))
                except QueueFullError as e:
                    await self._abort(context, grpc.StatusCode.UNAVAILABLE, str(e))
            return await self._call(method, request, context, metadata)

    async def _call(
        self, method: str, request: bytes, context: Any, metadata: tuple[tuple[str, str], ...]
    ) -> bytes:
        """One unary call upstream, its failure turned into the client's status (a silent
        tritonserver: UNAVAILABLE naming ``request_timeout_s``)."""
        remaining = context.time_remaining()
        timeout = self.limits.request_timeout_s
        if remaining is not None:
            timeout = min(timeout, remaining)
        try:
            async with self.unary_channel(metadata) as channel:
                return bytes(
                    await channel.unary_unary(method)(request, metadata=metadata, timeout=timeout)
                )
        except grpc.aio.AioRpcError as e:
            code = e.code()
            details = e.details() or ""
            if code == grpc.StatusCode.DEADLINE_EXCEEDED and (
                remaining is None or remaining > timeout
            ):
                code, details = (
                    grpc.StatusCode.UNAVAILABLE,
                    (
                        f"no answer from tritonserver within request_timeout_s="
                        f"{self.limits.request_timeout_s:g}"
                    ),
                )
            elif code == grpc.StatusCode.UNAVAILABLE and "connect" in details.lower():
                details = "tritonserver not reachable (restarting?)"
            elif code == grpc.StatusCode.NOT_FOUND and self.admission.draining is not None:
                code, details = grpc.StatusCode.UNAVAILABLE, f"{self.admission.draining}"
            await self._abort(context, code, details)
            raise  # unreachable: abort raises

    async def _tenant(self, method: str, context: Any) -> Tenant | None:
        """The caller's tenant (None: no tenants); aborts a call the tenants' gate refuses (no
        or unknown key, past a rate or quota)."""
        if self.admit is None or not (method == GRPC_INFER or method in GRPC_STREAMING):
            return None
        return await self.admit(context)

    async def _metadata(self, method: str, context: Any) -> tuple[tuple[str, str], ...]:
        """The caller's metadata minus reserved keys and the admin key; aborts the call with
        PERMISSION_DENIED when a restricted method lacks the key."""
        metadata = tuple(
            (k, v)
            for k, v in context.invocation_metadata() or ()
            if not k.startswith((":", "grpc-")) and k not in self.hidden
        )
        if method in GRPC_RESTRICTED and self.admin_key is not None:
            given = dict(context.invocation_metadata() or ())
            if not any(admin_ok(given.get(h), self.admin_key) for h in self.admin_headers):
                await context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"this API is restricted: send the admin key in the "
                    f"{self.admin_headers[0]} metadata",
                )
        return metadata


_FRONT_CODES = {
    503: grpc.StatusCode.UNAVAILABLE,
    403: grpc.StatusCode.PERMISSION_DENIED,
    401: grpc.StatusCode.UNAUTHENTICATED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def _status_code(e: FrontError) -> grpc.StatusCode:
    """The gRPC status of a refusal of the front (a bad request: ``INVALID_ARGUMENT``)."""
    return _FRONT_CODES.get(e.status, grpc.StatusCode.INVALID_ARGUMENT)
