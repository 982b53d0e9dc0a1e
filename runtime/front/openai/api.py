"""The OpenAI-compatible ``/v1`` API as pure functions: the model catalog discovered from the
served configs, request parsing (every problem an :class:`OpenAIError` naming the field, as
OpenAI's ``param``), and response/stream-chunk building. No I/O here; the route layer
(:mod:`~runtime.front.openai.app`) moves bytes between aiohttp and Triton.

The pieces: :mod:`~runtime.front.openai.catalog` (the model ids), :mod:`~runtime.front.openai.requests`
(request parsing), :mod:`~runtime.front.openai.responses` (responses, chunks, errors) and
:mod:`~runtime.front.openai.upstream` (what goes to Triton and comes back); this module gathers their
names, so that callers use one namespace (``from tritonforge.runtime.front.openai import api``).

What maps onto what (docs/openai.md):

- ``/v1/embeddings``: each embedding pipeline's ensembles, one model id per variant (the fp32
  ensemble under the pipeline's name, the others as ``<pipeline>-<variant>``);
- ``/v1/chat/completions`` and ``/v1/completions``: each decoupled model following the Triton
  generate convention (``text_input`` in; ``text_output`` and ``finish_reason`` out), under its
  model name. Classification pipelines have no OpenAI endpoint (they stay on v2).
"""

from __future__ import annotations

from tritonforge.runtime.errors import OpenAIError
from tritonforge.runtime.front.openai.catalog import (
    EMBEDDING,
    GENERATION,
    ServedModel,
    catalog,
    embedding_model_id,
    generation_routes,
    is_generator,
    model_card,
    models_list,
    resolve,
    task_handlers,
)
from tritonforge.runtime.front.openai.requests import (
    ENCODING_FORMATS,
    MAX_STOPS,
    ROLES,
    TEMPERATURE_MAX,
    EmbeddingRequest,
    GenerationRequest,
    bearer_token,
    check_prompt_tokens,
    message_text,
    parse_chat,
    parse_completion,
    parse_embeddings,
    parse_json,
    parse_messages,
)
from tritonforge.runtime.front.openai.responses import (
    SSE_DONE,
    chat_chunk,
    chat_completion,
    embeddings_response,
    error_body,
    new_id,
    now,
    sse,
    text_completion,
    upstream_error,
    usage,
)
from tritonforge.runtime.front.openai.upstream import (
    StreamChunk,
    bytes_tensor,
    embedding_infer_body,
    embedding_outputs,
    generate_request,
    stream_chunk,
    token_counts,
    unbytes,
)

__all__ = [
    "EMBEDDING",
    "ENCODING_FORMATS",
    "GENERATION",
    "MAX_STOPS",
    "ROLES",
    "SSE_DONE",
    "TEMPERATURE_MAX",
    "EmbeddingRequest",
    "GenerationRequest",
    "OpenAIError",
    "ServedModel",
    "StreamChunk",
    "bearer_token",
    "bytes_tensor",
    "catalog",
    "chat_chunk",
    "chat_completion",
    "check_prompt_tokens",
    "embedding_infer_body",
    "embedding_model_id",
    "embedding_outputs",
    "embeddings_response",
    "error_body",
    "generate_request",
    "generation_routes",
    "is_generator",
    "message_text",
    "model_card",
    "models_list",
    "new_id",
    "now",
    "parse_chat",
    "parse_completion",
    "parse_embeddings",
    "parse_json",
    "parse_messages",
    "resolve",
    "sse",
    "stream_chunk",
    "task_handlers",
    "text_completion",
    "token_counts",
    "unbytes",
    "upstream_error",
    "usage",
]
