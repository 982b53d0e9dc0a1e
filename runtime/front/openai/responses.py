"""The ``/v1`` response objects, stream chunks and errors, as OpenAI's clients read them."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np

from tritonforge.runtime.errors import OpenAIError


def error_body(message: str, status: int) -> dict[str, Any]:
    """OpenAI's error object for a refusal raised elsewhere (body limits, upstream errors)."""
    return OpenAIError(message, status).body()


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


def _head(rid: str, kind: str, created: int, model: str) -> dict[str, Any]:
    """The fields every completion object and chunk starts with (OpenAI's order)."""
    return {"id": rid, "object": kind, "created": created, "model": model}


def chat_completion(
    rid: str, created: int, model: str, text: str, finish: str, use: dict[str, int]
) -> dict[str, Any]:
    return {
        **_head(rid, "chat.completion", created, model),
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
        **_head(rid, "chat.completion.chunk", created, model),
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
        **_head(rid, "text_completion", created, model),
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
    an OpenAI error with the status a v2 client would get (:func:`front_stream.in_stream_status`,
    the v2 SSE relay's too)."""
    from tritonforge.runtime.front.stream import in_stream_status

    status = in_stream_status(message)
    if status == 503:
        return OpenAIError(f"{model}: {message} (retry later)", 503, None, "overloaded")
    if status == 499:
        return OpenAIError(f"{model}: {message}", 499, None, "cancelled")
    if status == 400:
        return OpenAIError(f"{model}: {message}", 400)
    return OpenAIError(f"{model}: {message} (see the server log)", 500)
