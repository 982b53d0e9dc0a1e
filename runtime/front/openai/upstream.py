"""What the ``/v1`` routes send to Triton and read back: the v2 embedding request and its
output, the gRPC generate request and its stream responses (BYTES tensors in Triton's raw
encoding)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

from tritonforge.generation import FINISH_REASON, TEXT_INPUT, TEXT_OUTPUT
from tritonforge.runtime.errors import OpenAIError
from tritonforge.runtime.front.openai.catalog import ServedModel
from tritonforge.runtime.front.openai.responses import upstream_error


def token_counts(attention_mask: Any) -> int:
    """Tokens the encoder sees: the ones of the attention mask, every row."""
    return int(np.asarray(attention_mask).sum())


def embedding_infer_body(model: ServedModel, texts: Sequence[str]) -> dict[str, Any]:
    """The v2 inference request for ``texts`` (its one output as binary data)."""
    return {
        "inputs": [
            {"name": model.input, "shape": [len(texts), 1], "datatype": "BYTES", "data": texts}
        ],
        "outputs": [{"name": model.output, "parameters": {"binary_data": True}}],
    }


def embedding_outputs(data: bytes, header_length: str | None, output: str) -> np.ndarray:
    """``output`` of a v2 inference response (binary, or JSON when no binary part came)."""
    try:
        split = int(header_length) if header_length is not None else len(data)
        header = json.loads(data[:split])
        offset = split
        for out in header["outputs"]:
            size = int((out.get("parameters") or {}).get("binary_data_size", 0))
            if out["name"] == output:
                if size:
                    values = np.frombuffer(data[offset : offset + size], dtype="<f4")
                else:
                    values = np.asarray(out["data"], dtype=np.float32)
                return values.reshape(out["shape"])
            offset += size
    except (ValueError, KeyError, TypeError) as e:
        raise OpenAIError(f"unreadable inference response from tritonserver ({e})", 500) from e
    raise OpenAIError(f"tritonserver's response has no output {output!r}", 500)


def bytes_tensor(values: Sequence[str]) -> bytes:
    """Triton's raw BYTES encoding: each element as a 4-byte little-endian length + bytes."""
    out = bytearray()
    for v in values:
        raw = v.encode("utf-8")
        out += len(raw).to_bytes(4, "little") + raw
    return bytes(out)


def unbytes(raw: bytes, errors: str = "replace") -> list[str]:
    """The strings of a raw BYTES tensor (:func:`bytes_tensor`'s inverse); ``errors``: how
    invalid UTF-8 is decoded (:meth:`bytes.decode`)."""
    out, i = [], 0
    while i + 4 <= len(raw):
        n = int.from_bytes(raw[i : i + 4], "little")
        out.append(raw[i + 4 : i + 4 + n].decode("utf-8", errors))
        i += 4 + n
    return out


def generate_request(
    model: str, prompt: str, parameters: Mapping[str, Any], stop: Sequence[str], rid: str
) -> Any:
    """The gRPC ``ModelInferRequest`` of one generation: ``text_input`` (and ``stop``) as
    tensors, sampling as request parameters, and the empty final response turned on (the end of
    the stream is then always visible)."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model, id=rid)
    for name, values in ((TEXT_INPUT, [prompt]), ("stop", list(stop))):
        if values:
            tensor = request.inputs.add()
            tensor.name, tensor.datatype = name, "BYTES"
            tensor.shape.append(len(values))
            request.raw_input_contents.append(bytes_tensor(values))
    for key, value in parameters.items():
        param = request.parameters[key]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, int):
            param.int64_param = value
        elif isinstance(value, float):
            param.double_param = value
        else:
            param.string_param = str(value)
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    return request


@dataclass(frozen=True)
class StreamChunk:
    text: str
    finish_reason: str | None = None  # set on the final response only
    outputs: Mapping[str, list[str]] = field(default_factory=dict)  # the model's other outputs


def stream_chunk(message: Any, model: str) -> StreamChunk:
    """One ``ModelStreamInferResponse`` -> text and, on the final one, the finish reason; an
    in-stream error raises :func:`upstream_error`."""
    if message.error_message:
        raise upstream_error(message.error_message, model)
    response = message.infer_response
    values = {
        out.name: unbytes(raw)
        for out, raw in zip(response.outputs, response.raw_output_contents, strict=False)
    }
    reason = values.get(FINISH_REASON)
    final = response.parameters.get("triton_final_response")
    text = "".join(values.get(TEXT_OUTPUT, []))
    others = {k: v for k, v in values.items() if k not in (TEXT_OUTPUT, FINISH_REASON)}
    if reason:
        return StreamChunk(text, reason[0], others)
    if final is not None and final.bool_param:
        raise OpenAIError(f"{model}: the final response carried no {FINISH_REASON}", 500)
    return StreamChunk(text, None, others)


@contextlib.contextmanager
def upstream_errors(timeout_message: str) -> Iterator[None]:
    """A silent or unreachable tritonserver, within the block, as a 503 :class:`OpenAIError`."""
    try:
        yield
    except TimeoutError as e:
        raise OpenAIError(timeout_message, 503) from e
    except (aiohttp.ClientError, OSError) as e:
        raise OpenAIError(
            f"tritonserver not reachable (restarting?): {type(e).__name__}", 503
        ) from e


def triton_error(status: int, data: bytes, where: str) -> OpenAIError:
    """A v2 error answer of tritonserver (``status``, body ``data``) as an :class:`OpenAIError`."""
    try:
        message = str(json.loads(data).get("error", ""))
    except (ValueError, AttributeError):
        message = data[:200].decode("utf-8", "replace")
    mapped = status if status in (400, 404, 413, 429, 503) else 500
    return OpenAIError(f"{where}: {message[:300]}", mapped)
