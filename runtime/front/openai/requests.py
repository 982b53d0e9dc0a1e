"""Parsing of the ``/v1`` request bodies: every problem an :class:`OpenAIError` naming the field
(as OpenAI's ``param``); a field this server cannot honour is refused unless it means "off"."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tritonforge.errors import InvalidInputError
from tritonforge.generation import CACHE_SALT_PARAMETER, cache_salt
from tritonforge.runtime.errors import OpenAIError
from tritonforge.runtime.front.openai.catalog import EMBEDDING, GENERATION, ServedModel, resolve

ENCODING_FORMATS = ("float", "base64")
ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOPS = 4  # OpenAI's own bound on `stop`
TEMPERATURE_MAX = 2.0  # OpenAI's range is [0, 2]
# Request fields this server cannot honour: refused (400 naming the field) unless they carry
# the value that means "off", so that a client never silently gets something else.
_UNSUPPORTED_UNLESS: dict[str, tuple[Any, ...]] = {
    "functions": (None, []),
    "best_of": (None, 1),
    "echo": (None, False),
    "suffix": (None, ""),
}


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
    n: int = 1  # choices (tasks/generation/routes.py)
    logprobs: bool = False  # the generate model streams each token's logprobs back
    tools: tuple[str, ...] = ()  # tool calling on: the output may be a call of these


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
    if body.get(CACHE_SALT_PARAMETER) is not None:  # vLLM's field: the prefix cache's namespace
        try:
            params[CACHE_SALT_PARAMETER] = salt = cache_salt(body)
        except InvalidInputError as e:
            raise OpenAIError(str(e), 400, CACHE_SALT_PARAMETER) from e
        if not salt:  # vLLM's rule too: leave the field out for the shared namespace
            raise OpenAIError(
                f"{CACHE_SALT_PARAMETER} must not be empty: leave it out (or null) to use the "
                "shared prefix cache",
                400,
                CACHE_SALT_PARAMETER,
            )
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
    body: Mapping[str, Any],
    models: Mapping[str, ServedModel],
    template: str | None,
    vocab_size: int | None = None,
) -> GenerationRequest:
    """``POST /v1/chat/completions``: ``messages`` rendered through the model's chat template
    (the model is then told not to apply it again). ``vocab_size``: the served tokenizer's
    (bounds ``logit_bias``'s token ids; None: the generate model checks them)."""
    from tritonforge.generation import render_chat

    model = resolve(models, body, GENERATION)
    _refuse_unsupported(body)
    from tritonforge.runtime.front.openai.catalog import generation_routes

    tools = generation_routes().chat_tools(body)  # rendered into the messages when asked
    messages = parse_messages(generation_routes().tool_messages(body.get("messages"), tools))
    if not template:
        raise OpenAIError(
            f"model {model.id!r} has no chat template; use /v1/completions", 400, "model"
        )
    params, stop = _sampling(body, model)
    stream, usage = _stream_flags(body)
    prompt = render_chat(messages, template)
    req = _request(body, model, prompt, params, stop, stream, usage, True, vocab_size)
    return generation_routes().with_tools(req, body, tools)


def parse_completion(
    body: Mapping[str, Any], models: Mapping[str, ServedModel], vocab_size: int | None = None
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
    return _request(body, model, prompt, params, stop, stream, usage, False, vocab_size)


def _request(
    body: Mapping[str, Any],
    model: ServedModel,
    prompt: str,
    params: dict[str, Any],
    stop: list[str],
    stream: bool,
    usage: bool,
    chat: bool,
    vocab_size: int | None,
) -> GenerationRequest:
    """The request with its structured-output fields and ``n`` checked and added."""
    from tritonforge.runtime.front.openai.catalog import generation_routes

    routes = generation_routes()
    n = routes.parse_n(body, stream)
    structured, logprobs = routes.structured_parameters(body, chat, vocab_size)
    parameters = {**params, **structured, "chat_template": False}
    return GenerationRequest(model, prompt, parameters, stop, stream, usage, n, logprobs)


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


def bearer_token(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None
