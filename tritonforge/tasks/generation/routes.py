"""The generation task's ``/v1`` pieces (the front reaches them through the registry:
``front.openai.catalog.generation_routes()``): the structured-output fields (``response_format``,
``logit_bias``, presence/frequency penalties, ``logprobs``/``top_logprobs``) and ``n``, checked
(the checks and OpenAI's shapes are :mod:`.structured`'s) and sent to the generate model as
request parameters; the choices' ``logprobs`` from the entries it streams back; a non-streamed
completion's ``n`` choices, each its own generate call (a scheduler row, ``seed + i`` when a
seed is given), run concurrently."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from aiohttp import web

from tritonforge.runtime.errors import OpenAIError
from tritonforge.runtime.front.guard import note_usage
from tritonforge.runtime.front.openai.catalog import GENERATION
from tritonforge.runtime.front.openai.requests import GenerationRequest, parse_messages
from tritonforge.runtime.front.openai.responses import (
    SSE_DONE,
    chat_chunk,
    chat_completion,
    now,
    sse,
    text_completion,
    usage,
)
from tritonforge.runtime.front.openai.upstream import StreamChunk
from tritonforge.tasks.generation import tools as tool_calls
from tritonforge.tasks.generation.structured import (
    LOGPROBS_OUTPUT,
    STRUCTURED_FIELDS,
    StructuredInputError,
    TokenLogprob,
    chat_logprobs,
    completion_logprobs,
    entries_from_json,
    parse_structured,
)

if TYPE_CHECKING:
    from tritonforge.runtime.front.openai.app import OpenAIFront, _Generator
    from tritonforge.runtime.front.openai.catalog import ServedModel

MAX_N = 8  # choices per request (each its own row; docs/openai.md)
# Without the served tokenizer (a unit test), token ids are bounded by the model only.
UNBOUNDED_VOCAB = 2**31


def structured_parameters(
    body: Mapping[str, Any], chat: bool, vocab_size: int | None
) -> tuple[dict[str, Any], bool]:
    """The generate model's request parameters for the body's structured fields (JSON strings
    for objects, as Triton request parameters carry them) and whether logprobs are asked.
    A bad value is a 400 naming the field (dotted inside objects, e.g.
    ``response_format.json_schema.schema``)."""
    if not chat:
        for name in ("tools", "tool_choice"):
            if body.get(name) not in (None, [], "none"):
                raise OpenAIError(f"'{name}' is a chat field (/v1/chat/completions)", 400, name)
    values = {k: body[k] for k in STRUCTURED_FIELDS if body.get(k) is not None}
    logprobs = values.get("logprobs")
    if chat and logprobs is not None and not isinstance(logprobs, bool):
        raise OpenAIError("'logprobs' must be a boolean (chat)", 400, "logprobs")
    if not chat:
        if "top_logprobs" in values:
            raise OpenAIError(
                "'top_logprobs' is a chat field; /v1/completions takes 'logprobs': N",
                400,
                "top_logprobs",
            )
        if isinstance(logprobs, bool):
            raise OpenAIError("'logprobs' must be an integer in [0, 20]", 400, "logprobs")
    try:
        parsed = parse_structured(values, vocab_size or UNBOUNDED_VOCAB)
    except StructuredInputError as e:
        raise OpenAIError(str(e), 400, e.field) from e
    params = {
        k: v if isinstance(v, bool | int | float | str) else json.dumps(v)
        for k, v in values.items()
    }
    return params, parsed.logprobs


def parse_n(body: Mapping[str, Any], stream: bool) -> int:
    """``n`` in [1, :data:`MAX_N`] (each choice is its own row: the prompt is prefilled per row)."""
    n = body.get("n")
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise OpenAIError(f"'n' must be an integer in [1, {MAX_N}], got {str(n)[:20]}", 400, "n")
    if n > 1 and stream:
        raise OpenAIError("'n' > 1 is not supported with 'stream': true (yet)", 400, "n")
    return n


def row_parameters(parameters: Mapping[str, Any], index: int) -> dict[str, Any]:
    """Choice ``index``'s parameters: with a ``seed``, row i samples with ``seed + i`` (so the n
    choices differ, and the same request gives the same n choices)."""
    out = dict(parameters)
    if "seed" in out and index:
        out["seed"] = (int(out["seed"]) + index) % 2**63
    return out


def choice_logprobs(
    tokenizer: Any, entries: list[TokenLogprob], chat: bool, text_offset: int = 0
) -> dict[str, Any]:
    """A choice's (or a streamed chunk's) ``logprobs`` object in OpenAI's shape."""
    if chat:
        return chat_logprobs(tokenizer, entries)
    return completion_logprobs(tokenizer, entries, text_offset)


Choice = tuple[str, str, list[TokenLogprob]]  # text, finish reason, token logprobs


async def respond(
    front: OpenAIFront,
    request: web.BaseRequest,
    req: GenerationRequest,
    gen: _Generator,
    prompt_tokens: int,
    chat: bool,
    rid: str,
) -> web.StreamResponse:
    """The whole completion (``req.n`` choices; streamed at the end when tools are on); 499
    when the client went away."""
    rows = await gather_all([collect(front, request, req, i, rid) for i in range(req.n)])
    done = [r for r in rows if r is not None]
    if len(done) < len(rows):
        return web.Response(status=499)  # gone: each call was cancelled
    created, mid = now(), req.model.id
    completion = sum(front._count(gen, text) for text, _, _ in done)
    note_usage(request, prompt_tokens, completion)  # the tenant's account
    use = usage(prompt_tokens, completion)
    build = chat_completion if chat else text_completion
    out = build(rid, created, mid, done[0][0], done[0][1], use)
    out["choices"] = [
        _choice_body(
            {
                **build(rid, created, mid, text, finish, use)["choices"][0],
                "index": i,
                "logprobs": choice_logprobs(gen.tokenizer, entries, chat) if req.logprobs else None,
            },
            text,
            finish,
            req.tools,
        )
        for i, (text, finish, entries) in enumerate(done)
    ]
    if req.stream:  # tools on: streamed once whole
        return await _stream_whole(request, req, out, rid)
    return web.json_response(out, headers={"X-Triton-Model": req.model.triton_model})


async def collect(
    front: OpenAIFront, request: web.BaseRequest, req: GenerationRequest, index: int, rid: str
) -> Choice | None:
    """Choice ``index``: its text, finish reason and token logprobs (None: the client went
    away). Each call holds its own tracked slot (drain and a crashed stub end it with a 503)."""
    mid = req.model.id
    async with front.session(request, req.model, stream=False) as session:
        front.start(session, replace(req, parameters=row_parameters(req.parameters, index)), rid)
        chunk = await front.next_chunk(session, mid)  # errors before any text: a real status
        parts, entries = [chunk.text], chunk_entries(chunk)
        while chunk.finish_reason is None:
            if request.transport is None or request.transport.is_closing():
                return None  # gone: the session's end cancels the call
            chunk = await front.next_chunk(session, mid)
            parts.append(chunk.text)
            entries += chunk_entries(chunk)
        return "".join(parts), chunk.finish_reason, entries


async def gather_all(coros: list[Coroutine[Any, Any, Any]]) -> list[Any]:
    """Every coroutine's result, run concurrently; the first failure cancels the others."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def chunk_entries(chunk: StreamChunk) -> list[TokenLogprob]:
    """The token logprobs a generate response carried (none when not asked)."""
    try:
        return [e for raw in chunk.outputs.get(LOGPROBS_OUTPUT, []) for e in entries_from_json(raw)]
    except ValueError as e:
        raise OpenAIError(f"unreadable {LOGPROBS_OUTPUT} output from the model ({e})", 500) from e


def stream_logprobs(
    gen: _Generator, chunk: StreamChunk, chat: bool, text_offset: int
) -> dict[str, Any]:
    """A streamed chunk's ``logprobs`` object (``text_offset``: the text streamed before it)."""
    return choice_logprobs(gen.tokenizer, chunk_entries(chunk), chat, text_offset)


def chat_tools(body: Mapping[str, Any]) -> tool_calls.Tools | None:
    """The chat request's tools (None: none, or ``tool_choice: "none"``); 400 naming the field."""
    try:
        return tool_calls.parse_tools(body)
    except StructuredInputError as e:
        raise OpenAIError(str(e), 400, e.field) from e


def tool_messages(raw: Any, tools: tool_calls.Tools | None) -> Any:
    """``messages`` with earlier tool calls as text and the tools in the system message."""
    try:
        return tool_calls.render_messages(raw, tools)
    except StructuredInputError as e:
        raise OpenAIError(str(e), 400, e.field) from e


def with_tools(
    req: GenerationRequest, body: Mapping[str, Any], tools: tool_calls.Tools | None
) -> GenerationRequest:
    """``req`` with tool calling on: a forced call (``required`` or a named function) is the
    grammar the output follows; ``auto`` leaves the output free (a call when it parses as one)."""
    if tools is None:
        return req
    schema = tools.forced_schema()
    parameters = dict(req.parameters)
    if schema is not None:
        if "response_format" in parameters:
            raise OpenAIError(
                "'response_format' cannot be combined with a forced 'tool_choice'",
                400,
                "tool_choice",
            )
        spec = {"name": "tool_calls", "schema": schema, "strict": True}
        parameters["response_format"] = json.dumps({"type": "json_schema", "json_schema": spec})
    return replace(req, parameters=parameters, tools=tools.names)


def _choice_body(
    base: dict[str, Any], text: str, finish: str, names: tuple[str, ...]
) -> dict[str, Any]:
    """A chat choice as a tool call when tools are on and ``text`` is one."""
    calls = tool_calls.parse_calls(text, names) if names and finish == "stop" else None
    if calls is None:
        return base
    message = {"role": "assistant", "content": None, "tool_calls": calls}
    return {**base, "message": message, "finish_reason": "tool_calls"}


async def _stream_whole(
    request: web.BaseRequest,
    req: GenerationRequest,
    out: dict[str, Any],
    rid: str,
) -> web.StreamResponse:
    """A streamed chat completion with tools, sent once the output is whole (a call is known
    only then): the role, then the content or one tool-call delta per call, the finish."""
    response = web.StreamResponse(
        status=200,
        headers={"Content-Type": "text/event-stream", "X-Triton-Model": req.model.triton_model},
    )
    await response.prepare(request)
    created, mid, usage_on = out["created"], out["model"], req.include_usage
    choice = out["choices"][0]
    message = choice["message"]
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    if message.get("tool_calls"):
        deltas += [{"tool_calls": [{"index": i, **c}]} for i, c in enumerate(message["tool_calls"])]
    elif message["content"]:
        deltas.append({"content": message["content"]})
    for delta in deltas:
        await response.write(sse(chat_chunk(rid, created, mid, delta, None, None, usage_on)))
    end = chat_chunk(rid, created, mid, {}, choice["finish_reason"], None, usage_on)
    end["choices"][0]["logprobs"] = choice["logprobs"]
    await response.write(sse(end))
    if usage_on:
        await response.write(sse(chat_chunk(rid, created, mid, None, None, out["usage"], True)))
    await response.write(SSE_DONE)
    await response.write_eof()
    return response


def _text_model(models: Mapping[str, ServedModel], body: Mapping[str, Any]) -> ServedModel:
    """The text model ``body["model"]`` names (the only one when it names none): a generator, or
    any catalog model with a served tokenizer stage (an embedder, a reranker: whichever task's)."""
    text = {k: m for k, m in models.items() if m.kind == GENERATION or m.tokenizer_model}
    name = body.get("model")
    if name is None and len(text) == 1:
        return next(iter(text.values()))
    if not isinstance(name, str) or name not in text:
        raise OpenAIError(f"'model' must name a served text model: {sorted(text)}", 400, "model")
    return text[name]


async def _tokenizer(front: OpenAIFront, model: ServedModel) -> tuple[Any, Any, int]:
    """``(tokenizers.Tokenizer, generation metadata or None, the prompt limit)``."""
    if model.kind != GENERATION:  # its tokenizer stage's (the BERT tokenizer discovery)
        tok = await asyncio.to_thread(front._embedding_tokenizer, model)
        return tok.tokenizer, None, tok.max_length
    gen = front._generator(model)
    meta_path = front._version_dir(model.triton_model) / model.params.get("generation_file", "")
    meta = front.cached(meta_path, lambda: json.loads(meta_path.read_text()))
    return (
        gen.tokenizer,
        {**meta, "chat_template": gen.template},
        model.param_int("max_prompt_tokens"),
    )


async def tokenize(front: OpenAIFront, request: web.BaseRequest, body: Any) -> web.Response:
    """vLLM's ``POST /tokenize``: ``{"model", "prompt"}`` or ``{"model", "messages"}`` (chat
    template applied, ``add_generation_prompt`` true) -> ``{"count", "max_model_len",
    "tokens"}``; ``add_special_tokens`` (default true) adds what the served model adds (a
    decoder's bos, an encoder's [CLS]/[SEP]); ``return_token_strs`` adds ``token_strs``."""
    from tritonforge.generation import render_chat, with_bos

    if not isinstance(body, Mapping):
        raise OpenAIError("the body must be a JSON object", 400)
    model = _text_model(await front.models(), body)
    tok, meta, limit = await _tokenizer(front, model)
    special = body.get("add_special_tokens", True)
    if not isinstance(special, bool):
        raise OpenAIError("'add_special_tokens' must be a boolean", 400, "add_special_tokens")
    if "messages" in body:
        template = (meta or {}).get("chat_template")
        if not template:
            raise OpenAIError(f"model {model.id!r} has no chat template", 400, "messages")
        prompt = render_chat(parse_messages(body["messages"]), template)
    elif isinstance(body.get("prompt"), str):
        prompt = str(body["prompt"])
    else:
        raise OpenAIError("'prompt' (a string) or 'messages' is required", 400, "prompt")
    if meta is not None:  # a decoder: the ids GenerateEngine.prompt_ids makes
        ids = tok.encode(prompt, add_special_tokens=False).ids
        ids = with_bos(ids, meta.get("prompt_bos_token_id")) if special else ids
    else:
        ids = tok.encode(prompt, add_special_tokens=special).ids
    out: dict[str, Any] = {"count": len(ids), "max_model_len": limit, "tokens": ids}
    if body.get("return_token_strs"):
        out["token_strs"] = [tok.id_to_token(i) for i in ids]
    return web.json_response(out)


async def detokenize(front: OpenAIFront, request: web.BaseRequest, body: Any) -> web.Response:
    """vLLM's ``POST /detokenize``: ``{"model", "tokens": [ids]}`` -> ``{"prompt": text}``."""
    if not isinstance(body, Mapping):
        raise OpenAIError("the body must be a JSON object", 400)
    model = _text_model(await front.models(), body)
    tok, _, _ = await _tokenizer(front, model)
    ids = body.get("tokens")
    size = tok.get_vocab_size()
    if not isinstance(ids, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < size for i in ids
    ):
        raise OpenAIError(f"'tokens' must be a list of token ids in [0, {size})", 400, "tokens")
    return web.json_response({"prompt": tok.decode(ids, skip_special_tokens=False)})


def served_models(configs: Iterable[Mapping[str, Any]]) -> dict[str, ServedModel]:
    """None of its own: the generate models are in the catalog by the generate convention."""
    return {}


ROUTES: dict[str, Any] = {"/tokenize": tokenize, "/detokenize": detokenize}
