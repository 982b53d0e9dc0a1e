"""The OpenAI-compatible ``/v1`` API as pure functions: the model catalog discovered from the
served configs, request parsing (every problem an :class:`OpenAIError` naming the field, as
OpenAI's ``param``), and response/stream-chunk building. No I/O here; the route layer
(:mod:`~runtime.openai_front`) moves bytes between aiohttp and Triton.

What maps onto what (docs/openai.md):

- ``/v1/embeddings``: each embedding pipeline's ensembles, one model id per variant (the fp32
  ensemble under the pipeline's name, the others as ``<pipeline>-<variant>``);
- ``/v1/chat/completions`` and ``/v1/completions``: each decoupled model following the Triton
  generate convention (``text_input`` in; ``text_output`` and ``finish_reason`` out), under its
  model name. Classification pipelines have no OpenAI endpoint (they stay on v2).
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tritonforge.generation import FINISH_REASON, TEXT_INPUT, TEXT_OUTPUT
from tritonforge.pipelines import PIPELINE_KEY, ROLE_KEY, _params, discover
from tritonforge.runtime.errors import FrontError

EMBEDDING, GENERATION = "embedding", "generation"
ENCODING_FORMATS = ("float", "base64")
ROLES = ("system", "developer", "user", "assistant")
MAX_STOPS = 4  # OpenAI's own bound on `stop`
TEMPERATURE_MAX = 2.0  # OpenAI's range is [0, 2]
# Request fields this server cannot honour: refused (400 naming the field) unless they carry
# the value that means "off", so that a client never silently gets something else.
_UNSUPPORTED_UNLESS: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "tools": (None, []),
    "functions": (None, []),
    "tool_choice": (None, "none", "auto"),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "best_of": (None, 1),
    "echo": (None, False),
    "suffix": (None, ""),
    "response_format": (None, {"type": "text"}),
}


class OpenAIError(FrontError):
    """A refused ``/v1`` request: ``status`` the HTTP status, ``param`` the offending field,
    ``code`` OpenAI's machine-readable code; :meth:`body` is OpenAI's error object."""

    def __init__(
        self, message: str, status: int = 400, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message, status)
        self.param, self.code = param, code

    @property
    def type(self) -> str:
        if self.status == 401:
            return "authentication_error"
        if self.status == 403:
            return "permission_error"
        if self.status == 404:
            return "not_found_error" if self.code != "model_not_found" else "invalid_request_error"
        if self.status == 429:
            return "rate_limit_error"
        if self.status >= 500:
            return "server_error"
        return "invalid_request_error"

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": str(self),
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def error_body(message: str, status: int) -> dict[str, Any]:
    """OpenAI's error object for a refusal raised elsewhere (body limits, upstream errors)."""
    return OpenAIError(message, status).body()


# -- the catalog ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServedModel:
    """One ``/v1`` model id and the Triton model behind it; ``params``: its config parameters."""

    id: str
    kind: str  # EMBEDDING | GENERATION
    triton_model: str
    pipeline: str
    variant: str = ""
    input: str = TEXT_INPUT
    output: str = TEXT_OUTPUT
    dim: int = 0
    max_items: int = 1
    max_text_bytes: int = 0
    tokenizer_model: str = ""  # embeddings: the pipeline's tokenizer model (usage counts)
    params: Mapping[str, str] = field(default_factory=dict)

    def param_int(self, key: str) -> int:
        try:
            return int(self.params[key])
        except (KeyError, ValueError) as e:
            raise OpenAIError(
                f"model {self.id!r}: its config has no integer parameter {key!r}", 500
            ) from e


def is_generator(config: Mapping[str, Any]) -> bool:
    """A decoupled model following the Triton generate convention."""
    policy = config.get("model_transaction_policy") or {}
    inputs = {str(t.get("name")) for t in config.get("input", [])}
    outputs = {str(t.get("name")) for t in config.get("output", [])}
    return (
        bool(policy.get("decoupled"))
        and TEXT_INPUT in inputs
        and {TEXT_OUTPUT, FINISH_REASON} <= outputs
    )


def embedding_model_id(pipeline: str, variant: str) -> str:
    return pipeline if variant == "fp32" else f"{pipeline}-{variant}"


def catalog(configs: Iterable[Mapping[str, Any]]) -> dict[str, ServedModel]:
    """The ``/v1`` models of the served ``configs`` (Triton's JSON model configs), by id."""
    configs = list(configs)
    out: dict[str, ServedModel] = {}
    tokenizers = {
        p[PIPELINE_KEY]: str(c["name"])
        for c in configs
        if (p := _params(c)).get(ROLE_KEY) == "tokenizer" and PIPELINE_KEY in p
    }
    for name, pipeline in discover(configs).items():
        if pipeline.task != "embedding":
            continue  # classification stays on v2
        for variant, model in pipeline.ensembles.items():
            mid = embedding_model_id(name, variant)
            out[mid] = ServedModel(
                id=mid,
                kind=EMBEDDING,
                triton_model=model,
                pipeline=name,
                variant=variant,
                input=pipeline.input,
                output=pipeline.outputs[0].name,
                dim=pipeline.dim,
                max_items=pipeline.max_items,
                max_text_bytes=pipeline.max_text_bytes,
                tokenizer_model=tokenizers.get(name, ""),
            )
    for config in configs:
        if is_generator(config):
            params = _params(config)
            name = str(config["name"])
            out[name] = ServedModel(
                id=name,
                kind=GENERATION,
                triton_model=name,
                pipeline=params.get(PIPELINE_KEY, name),
                variant=params.get("variant", ""),
                params=params,
            )
    return dict(sorted(out.items()))


def models_list(models: Mapping[str, ServedModel], created: int) -> dict[str, Any]:
    """``GET /v1/models``."""
    return {"object": "list", "data": [model_card(m, created) for m in models.values()]}


def model_card(model: ServedModel, created: int) -> dict[str, Any]:
    return {
        "id": model.id,
        "object": "model",
        "created": created,
        "owned_by": "tritonforge",
        # Extensions (ignored by OpenAI clients): what serves the id.
        "triton_model": model.triton_model,
        "task": model.kind,
    }


def resolve(models: Mapping[str, ServedModel], body: Mapping[str, Any], kind: str) -> ServedModel:
    """The served model ``body["model"]`` names (the Triton model name is accepted too)."""
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise OpenAIError("'model' is required: a model id from GET /v1/models", 400, "model")
    model = models.get(name) or next((m for m in models.values() if m.triton_model == name), None)
    of_kind = sorted(m.id for m in models.values() if m.kind == kind)
    if model is None or model.kind != kind:
        what = "not served" if model is None else f"a {model.kind} model, not {kind}"
        raise OpenAIError(
            f"model {name[:64]!r} is {what}; {kind} models: {of_kind}",
            404,
            "model",
            "model_not_found",
        )
    return model


# -- request bodies ------------------------------------------------------------------------------


def parse_json(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise OpenAIError(f"the body is not valid JSON ({e})", 400) from e
    if not isinstance(data, dict):
        raise OpenAIError("the body must be a JSON object", 400)
    return data


@dataclass(frozen=True)
class EmbeddingRequest:
    model: ServedModel
    texts: list[str]
    encoding_format: str


def parse_embeddings(
    body: Mapping[str, Any], models: Mapping[str, ServedModel]
) -> EmbeddingRequest:
    """``POST /v1/embeddings``: ``input`` a string or a list of strings (token arrays are
    refused), ``encoding_format`` float|base64, ``dimensions`` only the model's own."""
    model = resolve(models, body, EMBEDDING)
    raw = body.get("input")
    texts = [raw] if isinstance(raw, str) else raw
    if not isinstance(texts, list) or not texts:
        raise OpenAIError("'input' must be a string or a non-empty list of strings", 400, "input")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise OpenAIError(
                f"'input[{i}]' must be a string (token arrays are not supported)", 400, "input"
            )
        if not t:
            raise OpenAIError(f"'input[{i}]' is empty", 400, "input")
        if model.max_text_bytes and len(t.encode("utf-8")) > model.max_text_bytes:
            raise OpenAIError(
                f"'input[{i}]' has {len(t.encode('utf-8'))} bytes; model {model.id!r} takes at "
                f"most {model.max_text_bytes}",
                400,
                "input",
            )
    if len(texts) > model.max_items:
        raise OpenAIError(
            f"'input' has {len(texts)} items; model {model.id!r} takes at most {model.max_items} "
            "per request",
            400,
            "input",
        )
    fmt = body.get("encoding_format") or "float"
    if fmt not in ENCODING_FORMATS:
        raise OpenAIError(
            f"'encoding_format' must be one of {list(ENCODING_FORMATS)}, got {str(fmt)[:20]!r}",
            400,
            "encoding_format",
        )
    dims = body.get("dimensions")
    if dims is not None and (isinstance(dims, bool) or dims != model.dim):
        raise OpenAIError(
            f"'dimensions' {str(dims)[:20]} is not supported: model {model.id!r} returns "
            f"{model.dim} dimensions (omit the field or send {model.dim})",
            400,
            "dimensions",
        )
    return EmbeddingRequest(model, list(texts), fmt)


def embeddings_response(
    model_id: str, vectors: np.ndarray, encoding_format: str, prompt_tokens: int
) -> dict[str, Any]:
    """OpenAI's embedding list; base64 is the little-endian float32 bytes (what the ``openai``
    client decodes)."""
    vectors = np.asarray(vectors, dtype="<f4")
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": (
                base64.b64encode(row.tobytes()).decode("ascii")
                if encoding_format == "base64"
                else row.tolist()
            ),
        }
        for i, row in enumerate(vectors)
    ]
    return {
        "object": "list",
        "data": data,
        "model": model_id,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


@dataclass(frozen=True)
class GenerationRequest:
    """A chat or text completion mapped onto the generate model: ``prompt`` is the text the
    model sees (the chat template already applied to ``messages``), ``parameters`` the request
    parameters and ``stop`` the stop strings."""

    model: ServedModel
    prompt: str
    parameters: dict[str, Any]
    stop: list[str]
    stream: bool
    include_usage: bool


def _number(body: Mapping[str, Any], name: str, low: float, high: float, low_open: bool) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise OpenAIError(f"'{name}' must be a number", 400, name)
    if not ((low < value) if low_open else (low <= value)) or value > high:
        bracket = "(" if low_open else "["
        raise OpenAIError(
            f"'{name}' must be in {bracket}{low:g}, {high:g}], got {value}", 400, name
        )
    return float(value)


def _integer(body: Mapping[str, Any], name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise OpenAIError(f"'{name}' must be an integer", 400, name)
    if not low <= value <= high:
        raise OpenAIError(f"'{name}' must be in [{low}, {high}], got {value}", 400, name)
    return value


def _stops(body: Mapping[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if (
        not isinstance(stops, list)
        or len(stops) > MAX_STOPS
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise OpenAIError(
            f"'stop' must be a non-empty string or a list of at most {MAX_STOPS} of them",
            400,
            "stop",
        )
    return list(stops)


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
    for name, allowed in _UNSUPPORTED_UNLESS.items():
        if name in body and body[name] not in allowed:
            raise OpenAIError(f"'{name}' is not supported by this server", 400, name)
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise OpenAIError(f"'n' must be 1 (one choice per request), got {str(n)[:20]}", 400, "n")


def _sampling(body: Mapping[str, Any], model: ServedModel) -> tuple[dict[str, Any], list[str]]:
    limit = model.param_int("max_new_tokens_limit")
    given = {k: _integer(body, k, 1, limit) for k in ("max_completion_tokens", "max_tokens")}
    values = {k: v for k, v in given.items() if v is not None}
    if len(set(values.values())) > 1:
        raise OpenAIError(
            "'max_tokens' and 'max_completion_tokens' disagree; send one", 400, "max_tokens"
        )
    params: dict[str, Any] = {}
    if values:
        params["max_tokens"] = next(iter(values.values()))
    temperature = _number(body, "temperature", 0.0, TEMPERATURE_MAX, low_open=False)
    if temperature is not None:
        params["temperature"] = temperature
    top_p = _number(body, "top_p", 0.0, 1.0, low_open=True)
    if top_p is not None:
        params["top_p"] = top_p
    seed = _integer(body, "seed", 0, 2**63 - 1)
    if seed is not None:
        params["seed"] = seed
    return params, _stops(body)


def _stream_flags(body: Mapping[str, Any]) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise OpenAIError("'stream' must be a boolean", 400, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not isinstance(options, dict):
        raise OpenAIError("'stream_options' must be an object", 400, "stream_options")
    if not stream:
        raise OpenAIError(
            "'stream_options' is only allowed with 'stream': true", 400, "stream_options"
        )
    usage = options.get("include_usage", False)
    if not isinstance(usage, bool):
        raise OpenAIError("'stream_options.include_usage' must be a boolean", 400, "stream_options")
    return stream, usage


def message_text(content: Any, index: int) -> str:
    """A message's ``content``: a string or a list of ``{"type": "text", "text": ...}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise OpenAIError(
                    f"'messages[{index}].content': only text parts are supported", 400, "messages"
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise OpenAIError(
                    f"'messages[{index}].content': a text part needs a string 'text'",
                    400,
                    "messages",
                )
            parts.append(text)
        return "".join(parts)
    raise OpenAIError(
        f"'messages[{index}].content' must be a string or a list of text parts", 400, "messages"
    )


def parse_messages(raw: Any) -> list[dict[str, str]]:
    """``messages`` as ``[{"role", "content"}]`` for the chat template (``developer`` is
    OpenAI's new name of ``system``)."""
    if not isinstance(raw, list) or not raw:
        raise OpenAIError("'messages' must be a non-empty list", 400, "messages")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise OpenAIError(f"'messages[{i}]' must be an object", 400, "messages")
        role = m.get("role")
        if role not in ROLES:
            raise OpenAIError(
                f"'messages[{i}].role' must be one of {list(ROLES)}, got {str(role)[:20]!r}",
                400,
                "messages",
            )
        out.append(
            {
                "role": "system" if role == "developer" else str(role),
                "content": message_text(m.get("content"), i),
            }
        )
    return out


def parse_chat(
    body: Mapping[str, Any], models: Mapping[str, ServedModel], template: str | None
) -> GenerationRequest:
    """``POST /v1/chat/completions``: ``messages`` rendered through the model's chat template
    (the model is then told not to apply it again)."""
    from tritonforge.generation import render_chat

    model = resolve(models, body, GENERATION)
    _refuse_unsupported(body)
    messages = parse_messages(body.get("messages"))
    if not template:
        raise OpenAIError(
            f"model {model.id!r} has no chat template; use /v1/completions", 400, "model"
        )
    params, stop = _sampling(body, model)
    stream, usage = _stream_flags(body)
    prompt = render_chat(messages, template)
    return GenerationRequest(model, prompt, {**params, "chat_template": False}, stop, stream, usage)


def parse_completion(
    body: Mapping[str, Any], models: Mapping[str, ServedModel]
) -> GenerationRequest:
    """``POST /v1/completions``: ``prompt`` (a string, or a list of one) as is, no template."""
    model = resolve(models, body, GENERATION)
    _refuse_unsupported(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise OpenAIError(
            "'prompt' must be a non-empty string (one prompt per request)", 400, "prompt"
        )
    params, stop = _sampling(body, model)
    stream, usage = _stream_flags(body)
    return GenerationRequest(model, prompt, {**params, "chat_template": False}, stop, stream, usage)


def check_prompt_tokens(count: int, model: ServedModel, param: str) -> None:
    """400 ``context_length_exceeded`` past the model's ``max_prompt_tokens``."""
    limit = model.param_int("max_prompt_tokens")
    if count > limit:
        raise OpenAIError(
            f"the prompt has {count} tokens; model {model.id!r} takes at most {limit} "
            "(max_prompt_tokens)",
            400,
            param,
            "context_length_exceeded",
        )


# -- responses -----------------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chat_completion(
    rid: str, created: int, model: str, text: str, finish: str, use: dict[str, int]
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
        ],
        "usage": use,
    }


def chat_chunk(
    rid: str,
    created: int,
    model: str,
    delta: Mapping[str, str] | None,
    finish: str | None = None,
    use: dict[str, int] | None = None,
    include_usage: bool = False,
) -> dict[str, Any]:
    """A ``chat.completion.chunk``; ``delta=None`` is the usage-only chunk (no choices)."""
    chunk: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": (
            []
            if delta is None
            else [{"index": 0, "delta": dict(delta), "logprobs": None, "finish_reason": finish}]
        ),
    }
    if include_usage:
        chunk["usage"] = use  # null on every chunk but the last, as OpenAI sends it
    return chunk


def text_completion(
    rid: str, created: int, model: str, text: str, finish: str | None, use: dict[str, int] | None
) -> dict[str, Any]:
    """A ``text_completion`` object (whole, or one streamed chunk when ``use`` is None)."""
    out: dict[str, Any] = {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
    }
    if use is not None:
        out["usage"] = use
    return out


def sse(event: Mapping[str, Any]) -> bytes:
    """One server-sent event."""
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def upstream_error(message: str, model: str) -> OpenAIError:
    """The generate model's in-stream error (its messages name the field or the overload) as
    an OpenAI error with the status a v2 client would get."""
    lowered = message.lower()
    if any(h in lowered for h in ("overloaded", "shutting down", "unavailable", "not ready")):
        return OpenAIError(f"{model}: {message} (retry later)", 503, None, "overloaded")
    if "cancel" in lowered:
        return OpenAIError(f"{model}: {message}", 499, None, "cancelled")
    if any(h in lowered for h in ("invalid", "must be", "max_prompt_tokens", "expected")):
        return OpenAIError(f"{model}: {message}", 400)
    return OpenAIError(f"{model}: {message} (see the server log)", 500)


def bearer_token(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def token_counts(attention_mask: Any) -> int:
    """Tokens the encoder sees: the ones of the attention mask, every row."""
    return int(np.asarray(attention_mask).sum())


# -- the Triton side -----------------------------------------------------------------------------


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


def _bytes_tensor(values: Sequence[str]) -> bytes:
    """Triton's raw BYTES encoding: each element as a 4-byte little-endian length + bytes."""
    out = bytearray()
    for v in values:
        raw = v.encode("utf-8")
        out += len(raw).to_bytes(4, "little") + raw
    return bytes(out)


def _unbytes(raw: bytes) -> list[str]:
    out, i = [], 0
    while i + 4 <= len(raw):
        n = int.from_bytes(raw[i : i + 4], "little")
        out.append(raw[i + 4 : i + 4 + n].decode("utf-8", "replace"))
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
            request.raw_input_contents.append(_bytes_tensor(values))
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


def stream_chunk(message: Any, model: str) -> StreamChunk:
    """One ``ModelStreamInferResponse`` -> text and, on the final one, the finish reason; an
    in-stream error raises :func:`upstream_error`."""
    if message.error_message:
        raise upstream_error(message.error_message, model)
    response = message.infer_response
    values = {
        out.name: _unbytes(raw)
        for out, raw in zip(response.outputs, response.raw_output_contents, strict=False)
    }
    reason = values.get(FINISH_REASON)
    final = response.parameters.get("triton_final_response")
    text = "".join(values.get(TEXT_OUTPUT, []))
    if reason:
        return StreamChunk(text, reason[0])
    if final is not None and final.bool_param:
        raise OpenAIError(f"{model}: the final response carried no {FINISH_REASON}", 500)
    return StreamChunk(text)
