"""One generation over Triton's gRPC stream, as the front runs it for every HTTP stream it serves
(v2 ``generate_stream`` SSE, ``/v1`` completions): a decoupled ``ModelStreamInfer`` call carrying
one request, read response by response. Open streams hold no Triton HTTP thread and no
connection of the front's short-request pool; cancelling the call cancels the request in Triton
(the decode loop frees its slot at its next step)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
from tritonclient.grpc import service_pb2

from tritonforge.stream_errors import says_invalid, says_unavailable

GRPC_SERVICE = "/inference.GRPCInferenceService/"  # Triton's (KServe v2) gRPC service
STREAM_METHOD = f"{GRPC_SERVICE}ModelStreamInfer"
METADATA_METHOD = f"{GRPC_SERVICE}ModelMetadata"
EMPTY_FINAL_PARAMETER = "triton_enable_empty_final_response"


def in_stream_status(message: str) -> int:
    """The HTTP status of an in-stream error: 503 overload / shutdown, 499 cancelled, 400 a
    bad field, 500 otherwise."""
    lowered = message.lower()
    if says_unavailable(message):
        return 503
    if "cancel" in lowered:
        return 499
    if says_invalid(message):
        return 400
    return 500


def start_stream(
    channel: grpc.aio.Channel,
    message: service_pb2.ModelInferRequest,
    metadata: Sequence[tuple[str, str]] = (),
) -> Any:
    """A ``ModelStreamInfer`` call sending ``message`` alone (then half-closed), with the empty
    final response turned on so that the end of the request is always visible."""
    message.parameters[EMPTY_FINAL_PARAMETER].bool_param = True

    async def requests() -> AsyncIterator[service_pb2.ModelInferRequest]:
        yield message

    return channel.stream_stream(
        STREAM_METHOD,
        request_serializer=service_pb2.ModelInferRequest.SerializeToString,
        response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
    )(requests(), metadata=tuple(metadata) or None)


async def next_response(call: Any, timeout_s: float) -> service_pb2.ModelStreamInferResponse | None:
    """The next response of ``call`` (None once the call ended). Raises :class:`TimeoutError`
    when none came within ``timeout_s``, ``grpc.aio.AioRpcError`` for a failed call and
    ``asyncio.CancelledError`` for a cancelled one."""
    message = await asyncio.wait_for(call.read(), timeout_s)
    if message is grpc.aio.EOF:
        return None
    return message


async def model_inputs(
    channel: grpc.aio.Channel, model: str, version: str, timeout_s: float
) -> dict[str, tuple[str, list[int]]]:
    """``{input: (datatype, shape)}`` of ``model`` from Triton's model metadata (what Triton's
    own ``generate`` endpoint maps a request's keys onto)."""
    answer = await channel.unary_unary(
        METADATA_METHOD,
        request_serializer=service_pb2.ModelMetadataRequest.SerializeToString,
        response_deserializer=service_pb2.ModelMetadataResponse.FromString,
    )(service_pb2.ModelMetadataRequest(name=model, version=version), timeout=timeout_s)
    return {t.name: (t.datatype, [int(d) for d in t.shape]) for t in answer.inputs}
