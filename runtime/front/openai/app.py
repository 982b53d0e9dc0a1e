"""The ``/v1`` routes of the front (aiohttp): OpenAI's API mapped onto the served models.

Every request goes through Triton, never a second copy of a model: embeddings are one
``/v2/models/<ensemble>/infer`` over the front's HTTP upstream (the same connection pool,
``queue_timeout_s`` and ``request_timeout_s`` as v2 requests), completions one decoupled
``ModelStreamInfer`` call over the front's gRPC upstream channel (so open streams hold no Triton
HTTP thread). Bodies get the v2 limits (``max_body_bytes`` as sent and inflated,
``max_json_depth``). A client that goes away cancels its generation (the gRPC call is
cancelled, which frees the decoding slot). Parsing and response shapes live in
:mod:`~runtime.front.openai.catalog`, ``.requests``, ``.responses`` and ``.upstream``; a
completion's lifecycle in :class:`~runtime.front.session.StreamSession`; this module only moves
bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import grpc
import numpy as np
from aiohttp import web

from tritonforge.queue_forecast import retry_after_s
from tritonforge.runtime.errors import FrontError, OpenAIError
from tritonforge.runtime.front.body import INFLATE_WBITS, inflate, json_depth, read_body
from tritonforge.runtime.front.guard import QUEUE_PRIORITY_KEY, TENANT_KEY, USAGE_KEY, note_usage
from tritonforge.runtime.front.openai.catalog import (
    GENERATION,
    ServedModel,
    catalog,
    generation_routes,
    model_card,
    models_list,
    resolve,
    task_handlers,
)
from tritonforge.runtime.front.openai.requests import (
    GenerationRequest,
    bearer_token,
    check_prompt_tokens,
    parse_chat,
    parse_completion,
    parse_embeddings,
    parse_json,
)
from tritonforge.runtime.front.openai.responses import (
    SSE_DONE,
    chat_chunk,
    embeddings_response,
    new_id,
    now,
    sse,
    text_completion,
    usage,
)
from tritonforge.runtime.front.openai.upstream import (
    StreamChunk,
    embedding_infer_body,
    embedding_outputs,
    generate_request,
    stream_chunk,
    token_counts,
    triton_error,
    upstream_errors,
)
from tritonforge.runtime.front.queues import QueueFullError
from tritonforge.runtime.front.session import StreamRefusedError, StreamSession
from tritonforge.runtime.front.settings import OpenAISettings

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from tritonforge.runtime.front.http import HttpFront
    from tritonforge.text import TextTokenizer

log = logging.getLogger(__name__)
PREFIX = "/v1"
# The upstream session does not inflate (it forwards v2 bytes as they are): ask for none.
IDENTITY = {"Accept-Encoding": "identity"}


@dataclass
class _Generator:
    """What a completion needs besides Triton: the model's tokenizer and chat template."""

    tokenizer: Tokenizer
    template: str | None


class OpenAIFront:
    """Handles ``/v1`` for :class:`~runtime.front.http.HttpFront` (which owns the port and limits)."""

    def __init__(
        self,
        http: HttpFront,
        channel: Callable[[], grpc.aio.Channel],
        settings: OpenAISettings,
    ) -> None:
        self.http, self.channel, self.settings = http, channel, settings
        self._models: dict[str, ServedModel] = {}
        self._versions: dict[str, str] = {}
        self._fetched_s = -1e9
        self._lock: asyncio.Lock | None = None
        self._tokenizers: dict[Path, tuple[float, Any]] = {}

    @staticmethod
    def owns(path: str) -> bool:
        """``/v1`` and the tasks' own routes (e.g. ``/rerank``)."""
        return path == PREFIX or path.startswith(PREFIX + "/") or path in task_handlers()

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            self._authorize(request)
            path = request.path.rstrip("/")
            if path == f"{PREFIX}/models" or path.startswith(f"{PREFIX}/models/"):
                if request.method != "GET":
                    raise OpenAIError(f"{request.method} {path}: use GET", 405)
                return await self._models_route(path.removeprefix(f"{PREFIX}/models").strip("/"))
            routes: dict[str, Any] = {
                f"{PREFIX}/embeddings": self._embeddings,
                f"{PREFIX}/chat/completions": self._chat,
                f"{PREFIX}/completions": self._completions,
                **{p: functools.partial(h, self) for p, h in task_handlers().items()},
            }
            route = routes.get(path)
            if route is None:
                raise OpenAIError(
                    f"no route {path[:64]!r}; this server has {[*routes, PREFIX + '/models']}",
                    404,
                    None,
                    "unknown_url",
                )
            if request.method != "POST":
                raise OpenAIError(f"{request.method} {path}: use POST", 405)
            return await route(request, await self._body(request))
        except OpenAIError as e:
            return _error(e)
        except FrontError as e:
            return _error(OpenAIError(str(e), e.status))
        except Exception as e:  # a bug here: answer in OpenAI's shape, log it once
            log.exception("/v1 %s failed", request.path[:64])
            return _error(OpenAIError(f"internal error ({type(e).__name__}); see the log", 500))

    def _authorize(self, request: web.BaseRequest) -> None:
        key = self.settings.api_key
        if key is None:
            return
        given = bearer_token(request.headers.get("Authorization"))
        if given is None or not hmac.compare_digest(given.encode(), key.encode()):
            raise OpenAIError(
                "a valid API key is required: send 'Authorization: Bearer <key>' (the key "
                "the server got in $TRITONFORGE_OPENAI_API_KEY)",
                401,
                None,
                "invalid_api_key",
            )

    async def _body(self, request: web.BaseRequest) -> dict[str, Any]:
        body = await read_body(request, self.http.limits.max_body_bytes)
        encoding = request.headers.get("Content-Encoding", "").strip().lower()
        if encoding and encoding != "identity":
            if encoding not in INFLATE_WBITS:
                raise FrontError(f"Content-Encoding {encoding[:20]!r} not supported", 415)
            body = inflate(body, encoding, self.http.limits.max_body_bytes)
        depth = json_depth(body)
        if depth > self.http.limits.max_json_depth:
            raise OpenAIError(
                f"JSON nested {depth} levels deep; at most max_json_depth="
                f"{self.http.limits.max_json_depth} allowed",
                400,
            )
        return parse_json(body)

    # -- the catalog ---------------------------------------------------------------------
    async def models(self) -> dict[str, ServedModel]:
        """The ``/v1`` models of what Triton serves now (re-read after ``catalog_ttl_s``)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if time.monotonic() - self._fetched_s > self.settings.catalog_ttl_s:
                index = await self._triton_json("POST", "/v2/repository/index", {"ready": True})
                ready = {str(m["name"]): str(m.get("version", "1")) for m in index}
                configs = [
                    await self._triton_json("GET", f"/v2/models/{name}/config") for name in ready
                ]
                self._models, self._versions = catalog(configs), ready
                self._fetched_s = time.monotonic()
        return self._models

    async def _triton_json(self, method: str, path: str, payload: Any = None) -> Any:
        limits = self.http.limits
        timeout = aiohttp.ClientTimeout(
            total=limits.request_timeout_s, connect=limits.queue_timeout_s
        )
        silent = (
            f"no answer from tritonserver within request_timeout_s={limits.request_timeout_s:g}"
        )
        with upstream_errors(silent):
            async with self.http.session().request(
                method, f"http://triton{path}", json=payload, timeout=timeout, headers=IDENTITY
            ) as r:
                data = await r.read()
                if r.status != 200:
                    raise triton_error(r.status, data, path)
                return json.loads(data)

    async def _models_route(self, model_id: str) -> web.Response:
        models = await self.models()
        created = now()
        if not model_id:
            return web.json_response(models_list(models, created))
        if model_id not in models:
            raise OpenAIError(
                f"model {model_id[:64]!r} is not served; models: {sorted(models)}",
                404,
                "model",
                "model_not_found",
            )
        return web.json_response(model_card(models[model_id], created))

    def _version_dir(self, model: str) -> Path:
        return self.settings.model_repository / model / self._versions.get(model, "1")

    def cached(self, path: Path, load: Callable[[], Any]) -> Any:
        """``load()``'s result for the repository file ``path``, loaded again once the file
        changes (tokenizers, chat templates; a task's routes use it for theirs)."""
        try:
            mtime = path.stat().st_mtime
        except OSError as e:
            raise OpenAIError(
                f"{path.name} not found under the model repository ({e.strerror}); the front "
                "reads tokenizers and chat templates from the served repository",
                500,
            ) from e
        hit = self._tokenizers.get(path)
        if hit is None or hit[0] != mtime:
            hit = (mtime, load())
            self._tokenizers[path] = hit
        return hit[1]

    def _embedding_tokenizer(self, model: ServedModel) -> TextTokenizer:
        from tritonforge.text import served_tokenizer

        root = self.settings.model_repository / model.tokenizer_model
        version = self._versions.get(model.tokenizer_model, "1")
        return self.cached(root / "config.pbtxt", lambda: served_tokenizer(root, version))

    def _generator(self, model: ServedModel) -> _Generator:
        from tokenizers import Tokenizer

        base = self._version_dir(model.triton_model)
        tokenizer_path = base / model.params.get("tokenizer_file", "")
        meta_path = base / model.params.get("generation_file", "")
        tokenizer = self.cached(tokenizer_path, lambda: Tokenizer.from_file(str(tokenizer_path)))
        meta = self.cached(meta_path, lambda: json.loads(meta_path.read_text()))
        return _Generator(tokenizer, meta.get("chat_template"))

    # -- embeddings ----------------------------------------------------------------------
    async def _embeddings(self, request: web.BaseRequest, body: dict[str, Any]) -> web.Response:
        req = parse_embeddings(body, await self.models())
        m = req.model
        tokens = 0
        if m.tokenizer_model:  # off the loop: tokenizing up to max_body_bytes of text takes a while
            tokenizer = self._embedding_tokenizer(m)
            encoded = await asyncio.to_thread(tokenizer.encode, req.texts)
            tokens = token_counts(encoded["attention_mask"])
        vectors = await self._infer_embeddings(m, req.texts)
        return web.json_response(
            embeddings_response(m.id, vectors, req.encoding_format, tokens),
            headers={"X-Triton-Model": m.triton_model},
        )

    async def _infer_embeddings(self, m: ServedModel, texts: list[str]) -> np.ndarray:
        data, length = await self.infer(m.triton_model, embedding_infer_body(m, texts))
        return embedding_outputs(data, length, m.output)

    async def infer(self, model: str, payload: Any) -> tuple[bytes, str | None]:
        """One v2 ``infer`` of ``model`` (JSON ``payload``) over the upstream, holding a slot of
        each bounded queue of the model as a v2 ``/infer`` does: the body and its
        ``Inference-Header-Content-Length``; Triton's or the front's refusal as an
        :class:`OpenAIError`."""
        limits = self.http.limits
        timeout = aiohttp.ClientTimeout(
            total=limits.request_timeout_s, connect=limits.queue_timeout_s
        )
        try:
            async with self.http.queue_capacity.slot(model):
                with upstream_errors(self.http.timeout_message()):
                    async with self.http.session().post(
                        f"http://triton/v2/models/{model}/infer",
                        data=json.dumps(payload).encode(),
                        headers={"Content-Type": "application/json", **IDENTITY},
                        timeout=timeout,
                    ) as r:
                        data = await r.read()
                        if r.status != 200:
                            raise triton_error(r.status, data, model)
                        return data, r.headers.get("Inference-Header-Content-Length")
        except QueueFullError as e:
            raise OpenAIError(str(e), 503, None, "overloaded") from e

    # -- completions ---------------------------------------------------------------------
    async def _chat(self, request: web.BaseRequest, body: dict[str, Any]) -> web.StreamResponse:
        model = resolve(await self.models(), body, GENERATION)
        gen = self._generator(model)
        vocab = gen.tokenizer.get_vocab_size()
        req = await asyncio.to_thread(parse_chat, body, {model.id: model}, gen.template, vocab)
        return await self._generate(request, req, gen, chat=True)

    async def _completions(
        self, request: web.BaseRequest, body: dict[str, Any]
    ) -> web.StreamResponse:
        model = resolve(await self.models(), body, GENERATION)
        gen = self._generator(model)
        vocab = gen.tokenizer.get_vocab_size()
        req = await asyncio.to_thread(parse_completion, body, {model.id: model}, vocab)
        return await self._generate(request, req, gen, chat=False)

    async def _generate(
        self, request: web.BaseRequest, req: GenerationRequest, gen: _Generator, chat: bool
    ) -> web.StreamResponse:
        # The same ids as the generate model's own (GenerateEngine.prompt_ids), off the loop.
        prompt_tokens = await asyncio.to_thread(self._count, gen, req.prompt)
        check_prompt_tokens(prompt_tokens, req.model, "messages" if chat else "prompt")
        rid = new_id("chatcmpl" if chat else "cmpl")
        mid = req.model.id
        if not req.stream or req.tools:
            routes = generation_routes()  # n choices, logprobs, tool calls
            return await routes.respond(self, request, req, gen, prompt_tokens, chat, rid)
        async with self.session(request, req.model, stream=True) as session:
            self.start(session, req, rid)
            first = await self.next_chunk(session, mid)  # errors before any text: a real status
            return await self._stream(request, req, session, first, gen, prompt_tokens, chat, rid)

    @contextlib.asynccontextmanager
    async def session(
        self, request: web.BaseRequest, model: ServedModel, stream: bool
    ) -> AsyncIterator[StreamSession]:
        """A completion's :class:`StreamSession`: streamed, a slot among ``model``'s open streams
        (its bound, shared with the v2 SSE and gRPC streams to it), 503 in OpenAI's shape past
        it; non-streamed, no slot but tracked, so that the supervisor (a crashed stub) and the
        drain end it with a 503 saying why. The tenant's priority goes on its request."""
        session = StreamSession(
            self.http.admission,
            model.triton_model,
            self.http.limits.request_timeout_s,
            capacity=self.http.stream_capacity if stream else None,
            priority=request.get(QUEUE_PRIORITY_KEY),
            tenant=request.get(TENANT_KEY),
            slot=stream,
        )
        try:
            await session.__aenter__()
        except StreamRefusedError as e:
            raise OpenAIError(str(e), 503, None, "overloaded") from e
        try:
            yield session
        finally:
            session.close()

    async def _stream(
        self,
        request: web.BaseRequest,
        req: GenerationRequest,
        session: StreamSession,
        first: StreamChunk,
        gen: _Generator,
        prompt_tokens: int,
        chat: bool,
        rid: str,
    ) -> web.StreamResponse:
        created, mid, usage_on = now(), req.model.id, req.include_usage
        response = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Triton-Model": req.model.triton_model,
            },
        )
        await response.prepare(request)

        def event(
            text: str | None, finish: str | None = None, role: bool = False, lp: Any = None
        ) -> bytes:
            if chat:
                delta = {} if text is None else {"content": text}
                if role:
                    delta = {"role": "assistant", "content": ""}
                out = chat_chunk(rid, created, mid, delta, finish, None, usage_on)
            else:
                out = text_completion(rid, created, mid, text or "", finish, None)
                if usage_on:
                    out["usage"] = None
            if lp is not None:
                out["choices"][0]["logprobs"] = lp
            return sse(out)

        parts: list[str] = []
        try:
            if chat:
                await response.write(event(None, role=True))
            chunk: StreamChunk | None = first
            while chunk is not None:
                if chunk.text or chunk.outputs:
                    lp = None
                    if req.logprobs:  # completions' offsets count from the text so far
                        at = len("".join(parts))
                        lp = generation_routes().stream_logprobs(gen, chunk, chat, at)
                    parts.append(chunk.text)
                    await response.write(event(chunk.text, lp=lp))
                if chunk.finish_reason is not None:
                    await response.write(event(None, chunk.finish_reason))
                    break
                try:
                    chunk = await self.next_chunk(session, mid)
                except OpenAIError as e:  # mid-stream: the status is already sent
                    await response.write(sse(e.body()))
                    chunk = None
            if usage_on or USAGE_KEY in request:
                completion = _charged(request, prompt_tokens, gen, "".join(parts))
            if usage_on:
                use = usage(prompt_tokens, completion)
                if chat:
                    final = chat_chunk(rid, created, mid, None, None, use, True)
                else:
                    final = {**text_completion(rid, created, mid, "", None, use), "choices": []}
                await response.write(sse(final))
            await response.write(SSE_DONE)
            await response.write_eof()
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            session.client_left()  # the client went away: free its slot
        return response

    @staticmethod
    def _count(gen: _Generator, text: str) -> int:
        """Tokens of ``text`` by the served tokenizer (no special tokens added)."""
        return len(gen.tokenizer.encode(text, add_special_tokens=False).ids) if text else 0

    def start(self, session: StreamSession, req: GenerationRequest, rid: str) -> None:
        """Open ``req``'s generate call in ``session`` (with the tenant's priority)."""
        message = generate_request(
            req.model.triton_model, req.prompt, req.parameters, req.stop, rid
        )
        session.start(self.channel(), message)

    async def next_chunk(self, session: StreamSession, model: str) -> StreamChunk:
        """The next chunk of ``session``'s call; a call the front ended (drain, a crashed stub)
        is a 503 saying why, like the v2 streams' last event."""
        try:
            message = await session.read()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if session.reason is None or (task is not None and task.cancelling()):
                raise
            what = "stream" if session.slot else "request"
            raise OpenAIError(f"{session.reason}: {what} ended", 503) from None
        except TimeoutError as e:
            raise OpenAIError(
                f"{model}: no output from tritonserver within "
                f"request_timeout_s={session.timeout_s:g}",
                503,
            ) from e
        except grpc.aio.AioRpcError as e:
            code = e.code()
            status = 503 if code == grpc.StatusCode.UNAVAILABLE else 500
            raise OpenAIError(f"{model}: {code.name}: {e.details() or ''}"[:300], status) from e
        if message is None:
            raise OpenAIError(f"{model}: the stream ended without a final response", 500)
        chunk = stream_chunk(message, model)
        if chunk.finish_reason is not None:
            session.answered = True
        return chunk


def _error(e: OpenAIError) -> web.Response:
    headers = {"Retry-After": str(retry_after_s(str(e)))} if e.status == 503 else None
    return web.json_response(e.body(), status=e.status, headers=headers)


def _charged(request: web.BaseRequest, prompt_tokens: int, gen: _Generator, text: str) -> int:
    """The completion tokens of ``text``, noted for the tenants' gate (:data:`USAGE_KEY`, streamed
    or not) when it is on."""
    completion = OpenAIFront._count(gen, text)
    note_usage(request, prompt_tokens, completion)
    return completion
