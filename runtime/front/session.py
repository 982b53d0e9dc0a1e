"""One stream's life in the front, for every relay (v2 SSE, gRPC ``ModelStreamInfer``, ``/v1``):
an async context manager owning what each relay used to repeat. The relays keep only their wire
format.

``async with StreamSession(...) as session``:

- **capacity and admission**: reads the model's stream bound (``capacity(model)``, once per
  model), then takes one slot of :class:`~runtime.front.guard.Admission` (a non-streamed
  generation is only tracked: ``slot=False``); past the bound :class:`StreamRefusedError` (503,
  naming the model and its bound). As in TGI's router, the permit lives exactly as long as the
  ``async with`` block: it is released once, on a normal end, a client that left, an upstream
  error, a timeout or a cancelled task.
- **the upstream call**: :meth:`start` puts the tenant's priority on the request (the
  ``queue_priority`` parameter: the server's, a client-sent one is refused) and its tenant into
  the ``cache_salt`` parameter (tenants never share the prefix cache), and opens the
  decoupled gRPC call; :meth:`attach` adopts a call a relay opened itself (gRPC passthrough).
- **timeouts and the end**: :meth:`read` waits at most ``timeout_s`` for each response
  (:class:`TimeoutError`) and notes the final one; :meth:`end` (drain, the supervisor) records why
  and cancels the call; on exit the call is cancelled unless answered, else left to close
  (:func:`~runtime.front.stream_end.end_call`), the slot released and ``charge(prompt,
  completion)`` (the tenant's usage) called with what :meth:`note_usage` noted.

Adding a stream kind means a relay that opens a session: nothing else changes
(``tests/unit/test_front_session.py`` holds that).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any

import grpc
from tritonclient.grpc import service_pb2

from tritonforge.generation import QUEUE_PRIORITY_PARAMETER
from tritonforge.runtime.errors import FrontError
from tritonforge.runtime.front import stream as front_stream
from tritonforge.runtime.front import stream_end
from tritonforge.runtime.front.body import add_parameters
from tritonforge.runtime.front.guard import (
    LENGTH_HEADER,
    Admission,
    parse_header_length,
    set_cache_salt,
    set_queue_priority,
)

Capacity = Callable[[str], Awaitable[object]]
Charge = Callable[[int, int], None]


class StreamRefusedError(FrontError):
    """No slot for the stream (503): the message names the model and its bound; retry later."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 503)


class StreamSession:
    """One stream's slot, upstream call and end (see the module docstring). Used from the
    front's event loop only."""

    def __init__(
        self,
        admission: Admission,
        model: str | None,
        timeout_s: float,
        *,
        capacity: Capacity | None = None,
        priority: int | None = None,
        tenant: str | None = None,
        slot: bool = True,
        charge: Charge | None = None,
    ) -> None:
        """``model``: where the stream goes (None: a gRPC stream, whose messages name their
        models: :meth:`add_model`); ``timeout_s``: the longest wait for one response;
        ``priority``: the tenant's queue priority (never the client's); ``tenant``: its name,
        the prefix cache's salt (None: no tenants)."""
        self.admission, self.model, self.timeout_s = admission, model, timeout_s
        self.capacity, self.priority, self.slot, self.charge = capacity, priority, slot, charge
        self.tenant = tenant
        self.call: Any = None
        self.reason: str | None = None  # why the front ended it (drain, a crashed model)
        self.answered = False  # the final response came: the call is left to close
        self.usage = [0, 0]  # prompt, completion tokens noted for the charge
        self.token: int | None = None
        self._closed = False

    async def __aenter__(self) -> StreamSession:
        if self.model is not None and self.capacity is not None:
            await self.capacity(self.model)
        if self.slot:
            self.token = self.admission.open_stream(self.end, self.model)
        elif self.model is not None:
            self.token = self.admission.track(self.end, self.model)
        if self.token is None:
            raise StreamRefusedError(self.admission.full_message(self.model))
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """End the call (cancelled unless answered), release the slot, charge the usage: once."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.call is not None:
                stream_end.end_call(self.call, self.answered and self.reason is None)
        finally:
            self.admission.close_stream(self.token)
            if self.charge is not None:
                self.charge(*self.usage)

    async def add_model(self, model: str) -> None:
        """A gRPC stream's message goes to ``model``: it takes a slot of ``model`` too
        (:class:`StreamRefusedError` past its bound)."""
        if self.capacity is not None:
            await self.capacity(model)
        if not self.admission.stream_model(self.token, model):
            raise StreamRefusedError(self.admission.full_message(model))

    def prioritize(self, message: service_pb2.ModelInferRequest) -> None:
        """Put the tenant's priority on ``message`` (a client-sent one: 400) and its salt
        (:func:`~runtime.front.guard.set_cache_salt`)."""
        set_queue_priority(message, self.priority)
        set_cache_salt(message, self.tenant)

    def start(
        self,
        channel: grpc.aio.Channel,
        message: service_pb2.ModelInferRequest,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> Any:
        """Open the decoupled call carrying ``message`` alone, with the tenant's priority."""
        self.prioritize(message)
        return self.attach(front_stream.start_stream(channel, message, metadata))

    def attach(self, call: Any) -> Any:
        """Adopt ``call`` as this stream's upstream call (cancelled at once if already ended)."""
        self.call = call
        if self.reason is not None:
            call.cancel()
        return call

    async def read(self) -> service_pb2.ModelStreamInferResponse | None:
        """The next response (None at the call's end); :class:`TimeoutError` after
        ``timeout_s`` without one, ``grpc.aio.AioRpcError`` for a failed call,
        ``asyncio.CancelledError`` for a cancelled one (:attr:`reason` says whether the front
        ended it). Several tokens in one response pass through as they came."""
        message = await front_stream.next_response(self.call, self.timeout_s)
        if message is not None and stream_end.is_final(message):
            self.answered = True
        return message

    def end(self, reason: str) -> None:
        """End the stream from the front's side (drain, a crashed model): the relay's read
        fails and :attr:`reason` says why."""
        self.reason = self.reason or reason
        if self.call is not None:
            self.call.cancel()

    def client_left(self) -> None:
        """The client went away: free the model's slot now (the call is cancelled unless it was
        answered)."""
        if self.call is not None:
            stream_end.end_call(self.call, self.answered)

    def note_usage(self, prompt_tokens: int, completion_tokens: int) -> None:
        """The tokens charged to the tenant when the session ends."""
        self.usage = [prompt_tokens, completion_tokens]


def prioritized_body(
    generate: bool, body: bytes, header_length: str | None, priority: int | None
) -> tuple[bytes, str | None]:
    """A non-streamed v2 request (``/infer``, or Triton's ``/generate`` JSON when ``generate``)
    with the tenant's ``priority`` as its ``queue_priority`` parameter, and its new
    ``Inference-Header-Content-Length`` (None for plain JSON). The parameter is the server's: a
    body that sets it is refused (400 naming it). A body that is not a JSON object is left as it
    came (the front's JSON checks and Triton answer it)."""
    split = parse_header_length(header_length, len(body), LENGTH_HEADER) if header_length else None
    text = body[:split] if split is not None else body
    if (priority is None or priority <= 0) and not (
        QUEUE_PRIORITY_PARAMETER.encode() in text or b"\\u" in text  # a key spelt with escapes
    ):
        return body, header_length  # nothing to add, nothing to refuse: no parse on the hot path
    try:
        header = json.loads(text or b"{}")
    except ValueError:
        return body, header_length
    if not isinstance(header, dict):
        return body, header_length
    nested = header.get("parameters")
    if (generate and QUEUE_PRIORITY_PARAMETER in header) or (
        isinstance(nested, dict) and QUEUE_PRIORITY_PARAMETER in nested
    ):
        raise FrontError(
            f"request parameter {QUEUE_PRIORITY_PARAMETER!r} is set by the server from the "
            f"tenant's priority; leave it out",
            400,
        )
    if priority is None or priority <= 0:
        return body, header_length
    if not generate:
        return add_parameters(body, header_length, {QUEUE_PRIORITY_PARAMETER: priority})
    header[QUEUE_PRIORITY_PARAMETER] = priority
    return json.dumps(header, separators=(",", ":")).encode(), None
