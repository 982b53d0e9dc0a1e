"""Ending a gRPC ``ModelStreamInfer`` call to Triton without leaking it.

Triton 2.51's gRPC stream handler never releases a stream's state when a cancel lands while
the final response is still being written (server#8078 reworked this after 2.51); the state
holds the request, the request holds the model, and tritonserver then waits out its exit
timeout at shutdown and exits 1 (measured with the supervisor's canaries: 8 of 150 streams
cancelled right after their final response leaked; runtime/supervisor/canaries.py ``end_stream``). So a
call whose every request got its final response is left to close: its request stream is
half-closed, and Triton ends the call at once; it is cancelled only if still open after
:data:`STREAM_END_S`. A call still generating is cancelled at once: that frees its decoding
slot, and the race needs a final response in flight.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tritonclient.grpc import service_pb2

FINAL_PARAMETER = "triton_final_response"
STREAM_END_S = 2.0  # how long a fully answered call may take to close before it is cancelled

_ending: set[asyncio.Task[None]] = set()  # strong references: the loop keeps only weak ones


def is_final(message: service_pb2.ModelStreamInferResponse) -> bool:
    """Whether ``message`` is the last response of its request."""
    final = message.infer_response.parameters.get(FINAL_PARAMETER)
    return final is not None and final.bool_param


def final_in(raw: bytes) -> bool:
    """:func:`is_final` of a serialized response (False for one that does not parse)."""
    try:
        return is_final(service_pb2.ModelStreamInferResponse.FromString(raw))
    except Exception:  # a message the front relays as it came; it only decides how to end
        return False


def end_call(call: Any, answered: bool, timeout_s: float = STREAM_END_S) -> None:
    """End ``call`` (a ``grpc.aio`` stream-stream call): cancel it now unless ``answered``
    (every request it carried got its final response and its request stream is, or is being,
    half-closed); then let Triton close it, cancelling it only after ``timeout_s``."""
    if call.done():
        return
    if not answered:
        call.cancel()
        return
    task = asyncio.get_running_loop().create_task(_close_or_cancel(call, timeout_s))
    _ending.add(task)
    task.add_done_callback(_ending.discard)


async def _close_or_cancel(call: Any, timeout_s: float) -> None:
    try:
        await asyncio.wait_for(call.code(), timeout_s)
    except TimeoutError:
        pass
    finally:
        call.cancel()  # a no-op once Triton closed it
