"""Triton's HTTP ``generate`` extension, as the front serves ``generate_stream`` itself over gRPC.

The request: every key of the JSON object, and every key of its ``parameters`` object, is an
input tensor when the model has an input of that name (datatype and shape from the model's
metadata: the fixed dimensions take their size, the innermost variable one the rest) and a
request parameter otherwise (string, integer, number or boolean) — Triton 2.51's
``GenerateRequestClass::ConvertGenerateRequest``.

The response: each one is a server-sent event ``data: {json}\\n\\n`` whose object has the keys
``id`` (when set), ``model_name``, ``model_version``, the response parameters and one key per
output (a one-element output as its value, a longer one as a list), in the byte order of their
names, written compactly with non-ASCII text as UTF-8 (``FinalizeResponse``); an error is
``data: {"error":"..."}\\n\\n``; a flag-only final response writes nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2

from tritonforge.errors import shown
from tritonforge.queue_forecast import retry_after_s
from tritonforge.runtime.errors import FrontError
from tritonforge.runtime.front.openai.upstream import unbytes
from tritonforge.runtime.front.stream_end import FINAL_PARAMETER

NESTED = "parameters"  # the one nested key of Triton's generate request schema
CONTENT_TYPE = "text/event-stream; charset=utf-8"
_NUMPY = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}
# Python writes control characters as \u00xx, rapidjson (Triton) as \u00XX
_LOWER_HEX_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u00([01][0-9a-f])")


def dumps(value: Any) -> bytes:
    """``value`` as Triton writes JSON: compact, UTF-8 (bytes that are not UTF-8 pass through
    as they came, like Triton's), control characters as upper-case ``\\u00XX``."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    text = _LOWER_HEX_ESCAPE.sub(lambda m: f"{m.group(1)}\\u00{m.group(2).upper()}", text)
    return text.encode("utf-8", "surrogateescape")


def sse_event(payload: Mapping[str, Any]) -> bytes:
    """One server-sent event as Triton's ``generate_stream`` writes it."""
    return b"data: " + dumps(payload) + b"\n\n"


def stream_headers(status: int, first_event: bytes = b"") -> dict[str, str]:
    """The headers of a ``generate_stream`` answer whose first event is ``first_event``: a 503
    (an overload refusal) says when to retry, as the front's other 503s do: ``Retry-After``,
    the seconds the refusal names (the generate scheduler's predicted wait), else 1."""
    headers = {"Content-Type": CONTENT_TYPE}
    if status == 503:
        headers["Retry-After"] = str(retry_after_s(first_event.decode("utf-8", "replace")))
    return headers


def error_event(message: str) -> bytes:
    return sse_event({"error": message})


def _bytes_tensor(values: list[bytes]) -> bytes:
    return b"".join(len(v).to_bytes(4, "little") + v for v in values)


def _tensor(name: str, value: Any, datatype: str, dims: list[int]) -> tuple[list[int], bytes]:
    """``(shape, raw contents)`` of the input ``name`` from a JSON value."""
    values = value if isinstance(value, list) else [value]
    count = len(values)
    shape = list(dims)
    for i in reversed(range(len(shape))):
        if shape[i] != -1:
            if shape[i] == 0 or count % shape[i]:
                raise FrontError(
                    f"The schema can not convert input {shown(name)} to tensor with proper shape",
                    400,
                )
            count //= shape[i]
    for i in reversed(range(len(shape))):
        if shape[i] == -1:
            shape[i], count = count, 1
    if count != 1:
        raise FrontError(
            f"The schema can not convert input {shown(name)} to tensor with proper shape", 400
        )
    if datatype == "BYTES":
        if not all(isinstance(v, str) for v in values):
            raise FrontError(f"Unable to parse JSON bytes array for input {shown(name)}", 400)
        return shape, _bytes_tensor([v.encode("utf-8", "surrogateescape") for v in values])
    dtype = _NUMPY.get(datatype)
    ok = (
        (lambda v: isinstance(v, bool))
        if datatype == "BOOL"
        else (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool))
        if datatype.startswith("FP")
        else (lambda v: isinstance(v, int) and not isinstance(v, bool))
    )
    if dtype is None or not all(ok(v) for v in values):
        raise FrontError(f"input {shown(name)}: values are not {datatype}", 400)
    try:
        return shape, np.asarray(values, dtype=dtype).astype(
            np.dtype(dtype).newbyteorder("<")
        ).tobytes()
    except (OverflowError, ValueError) as e:
        raise FrontError(f"input {shown(name)}: {shown(str(e))}", 400) from e


def _parameter(request: service_pb2.ModelInferRequest, key: str, value: Any) -> None:
    param = request.parameters[key]
    if isinstance(value, str):
        param.string_param = value
    elif isinstance(value, bool):
        param.bool_param = value
    elif isinstance(value, int) and -(2**63) <= value < 2**63:
        param.int64_param = value
    elif isinstance(value, float):
        param.double_param = value
    else:
        del request.parameters[key]
        raise FrontError(
            f"parameter {shown(key)} has invalid type: a string, number or boolean is expected",
            400,
        )


def infer_request(
    model: str, version: str, body: Any, inputs: Mapping[str, tuple[str, list[int]]]
) -> service_pb2.ModelInferRequest:
    """The gRPC request Triton's ``generate`` endpoint would build from the JSON ``body`` for
    ``model`` with ``inputs`` (``{name: (datatype, shape)}``); 400 naming the key otherwise."""
    if not isinstance(body, dict):
        raise FrontError("the generate request must be a JSON object", 400)
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version)

    def mapped(key: str, value: Any) -> None:
        if key not in inputs:
            _parameter(request, key, value)
            return
        datatype, dims = inputs[key]
        shape, raw = _tensor(key, value, datatype, dims)
        tensor = request.inputs.add()
        tensor.name, tensor.datatype = key, datatype
        tensor.shape.extend(shape)
        request.raw_input_contents.append(raw)

    for key, value in body.items():
        if key != NESTED:
            mapped(key, value)
            continue
        if key in inputs:
            raise FrontError(
                f"Keyword '{NESTED}' for nested schema also given as input tensor name", 400
            )
        if not isinstance(value, dict):
            raise FrontError(f"Expected JSON object for keyword: '{NESTED}'", 400)
        for nested_key, nested_value in value.items():
            mapped(nested_key, nested_value)
    return request


def _output_values(datatype: str, raw: bytes) -> list[Any]:
    if datatype == "BYTES":
        return list[Any](unbytes(raw, errors="surrogateescape"))
    dtype = _NUMPY.get(datatype)
    if dtype is None:
        raise FrontError(f"output datatype {shown(datatype)} cannot be written as JSON", 500)
    values: list[Any] = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).tolist()
    return values


def response_event(response: service_pb2.ModelInferResponse) -> bytes | None:
    """The event of one response (None for a flag-only final response, which Triton's HTTP
    endpoint does not write)."""
    final = response.parameters.get(FINAL_PARAMETER)
    if not response.outputs and final is not None and final.bool_param:
        return None
    # Triton collects these in a std::map (the first of a name wins) and writes them in order
    fields: dict[str, Any] = {}
    if response.id:
        fields["id"] = response.id
    fields["model_name"] = response.model_name
    fields["model_version"] = response.model_version
    for key, param in response.parameters.items():
        if key == FINAL_PARAMETER:  # added by Triton's gRPC endpoint, not by the model
            continue
        which = param.WhichOneof("parameter_choice")
        if which in ("bool_param", "int64_param", "string_param"):
            fields.setdefault(key, getattr(param, which))
    for out, raw in zip(response.outputs, response.raw_output_contents, strict=False):
        values = _output_values(out.datatype, raw)
        fields.setdefault(out.name, values if len(values) != 1 else values[0])
    ordered = {
        k: fields[k] for k in sorted(fields, key=lambda k: k.encode("utf-8", "surrogateescape"))
    }
    return sse_event(ordered)
