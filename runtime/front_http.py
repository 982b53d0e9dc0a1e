"""The front's HTTP relay: an aiohttp handler forwarding to Triton's HTTP Unix socket, after the
body bounds and checks (:mod:`runtime.front_body`), the admin key check on the restricted APIs and
the headers turned into request parameters; ``generate_stream`` streams on a pool of their own."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from tritonforge.runtime import degrade_headers
from tritonforge.runtime.errors import FrontError
from tritonforge.runtime.front_body import (
    INFLATE_WBITS,
    add_parameters,
    apply_version_header,
    check_json_shapes,
    inflate,
    json_depth,
    json_has_version,
)
from tritonforge.runtime.front_guard import (
    LENGTH_HEADER,
    VERSION_HEADER,
    VERSION_PARAMETER,
    Admission,
    PinPolicy,
    ThrottledLog,
    admin_ok,
    check_model_name,
    parse_header_length,
    shown,
)
from tritonforge.runtime.front_settings import FrontLimits

if TYPE_CHECKING:
    from tritonforge.runtime.openai_front import OpenAIFront

log = logging.getLogger(__name__)

# Triton's restricted HTTP endpoints (model-repository, model-config, shared-memory, statistics,
# trace, logging), matched on the decoded path so percent-encoding cannot dodge them.
HTTP_RESTRICTED = re.compile(
    r"^/v2/(repository|systemsharedmemory|cudasharedmemory|logging|trace)(/|$)"
    r"|^/v2/models(/.*)?/(config|stats|trace)(/|$)"
)
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "host",
    "content-length",
}
STREAM_PATH_SUFFIX = "/generate_stream"
PIN_POLICY_TTL_S = 30.0
SHUTTING_DOWN = "the server is shutting down"
_DRAIN_NOT_FOUND = ("has no available versions", "unknown model", "is not found")


def _model_of(path: str) -> str | None:
    """The model name of a ``/v2/models/<name>/...`` path (None for other paths)."""
    parts = path.split("/")
    return parts[3] if len(parts) > 3 and parts[1:3] == ["v2", "models"] else None


def sse_event(payload: dict[str, Any]) -> bytes:
    """One server-sent event as Triton's ``generate_stream`` writes it."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class HttpFront:
    """aiohttp server on ``host:port`` forwarding to Triton's HTTP Unix socket.

    Short requests and ``generate_stream`` streams use separate upstream connection pools, so
    open streams never take a connection a short request needs; streams are bounded by
    ``admission`` (503 past the bound)."""

    def __init__(
        self,
        upstream_socket: Callable[[], Path],
        admin_key: str | None,
        admin_header: str,
        limits: FrontLimits,
        admission: Admission | None = None,
        errors: ThrottledLog | None = None,
    ) -> None:
        self.upstream_socket = upstream_socket
        self.admin_key = admin_key
        self.admin_header = admin_header
        self.limits = limits
        self.admission = admission or Admission(limits.max_open_streams)
        self.errors = errors or ThrottledLog(log)
        self._sessions: dict[str, aiohttp.ClientSession] = {}
        self._session_socket: Path | None = None
        self.openai: OpenAIFront | None = None  # the /v1 routes (runtime/openai_front.py)
        self._closing: set[asyncio.Task[None]] = set()
        self._pins: tuple[Path, float, PinPolicy] | None = None

    def session(self, pool: str = "short") -> aiohttp.ClientSession:
        """The upstream session of ``pool`` ("short" or "stream"), reopened after a restart."""
        path = self.upstream_socket()
        if self._session_socket != path:
            self._drop_sessions()
            self._session_socket = path
        session = self._sessions.get(pool)
        if session is None:
            limit = (
                self.limits.max_open_streams
                if pool == "stream"
                else self.limits.max_upstream_connections
            )
            connector = aiohttp.UnixConnector(path=str(path), limit=max(1, limit))
            session = self._sessions[pool] = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, skip_auto_headers=("User-Agent",)
            )
        return session

    def _drop_sessions(self) -> None:
        loop = asyncio.get_running_loop()
        for session in self._sessions.values():
            task = loop.create_task(session.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        self._sessions = {}

    async def pin_policy(self) -> PinPolicy | None:
        """Which models honour a version pin, from the served configs (cached for
        ``PIN_POLICY_TTL_S`` and per upstream); None when tritonserver cannot say."""
        now = time.monotonic()
        key = self.upstream_socket()
        cached = self._pins
        if cached is not None and cached[0] == key and now - cached[1] < PIN_POLICY_TTL_S:
            return cached[2]
        headers = {self.admin_header: self.admin_key} if self.admin_key else {}
        timeout = aiohttp.ClientTimeout(total=self.limits.queue_timeout_s)
        session = self.session()
        try:
            async with session.post(
                "http://triton/v2/repository/index", headers=headers, timeout=timeout
            ) as resp:
                index = await resp.json(content_type=None) if resp.status == 200 else []
            configs = []
            for name in sorted({str(m.get("name")) for m in index if m.get("state") == "READY"}):
                async with session.get(
                    f"http://triton/v2/models/{urllib.parse.quote(name)}/config",
                    headers=headers,
                    timeout=timeout,
                ) as resp:
                    if resp.status == 200:
                        configs.append(await resp.json(content_type=None))
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            return None
        policy = PinPolicy.from_configs(configs)
        self._pins = (key, now, policy)
        return policy

    async def check_pin(self, model: str, field: str) -> None:
        """400 naming ``field`` when ``model`` cannot pin a version (see :class:`PinPolicy`)."""
        policy = await self.pin_policy()
        if policy is not None:
            policy.check(model, field)

    async def close(self) -> None:
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            await session.close()

    async def _read_body(self, request: web.BaseRequest) -> bytes:
        limit = self.limits.max_body_bytes
        length = request.content_length
        if length is not None and length > limit:
            raise FrontError(f"body of {length} bytes exceeds max_body_bytes={limit}", 413)
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.content.iter_any():
            size += len(chunk)
            if size > limit:
                raise FrontError(f"body exceeds max_body_bytes={limit}", 413)
            chunks.append(chunk)
        return b"".join(chunks)

    def _check_json(self, request: web.BaseRequest, body: bytes) -> None:
        header = request.headers.get(LENGTH_HEADER)
        json_part = body
        if header is not None:
            json_part = body[: parse_header_length(header, len(body), LENGTH_HEADER)]
        depth = json_depth(json_part)
        if depth > self.limits.max_json_depth:
            raise FrontError(
                f"JSON nested {depth} levels deep; at most max_json_depth="
                f"{self.limits.max_json_depth} allowed",
                400,
            )
        check_json_shapes(json_part)

    def _restricted(self, request: web.BaseRequest) -> bool:
        raw = request.rel_url.raw_path
        decoded = urllib.parse.unquote(raw)
        return any(HTTP_RESTRICTED.search(re.sub("/+", "/", p)) for p in (raw, decoded))

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Answer every request: a refusal is a 4xx naming the field, never a 500 with a
        traceback; an unexpected failure is a 500 logged once per kind per interval."""
        try:
            if self.admission.draining is not None:
                return _unavailable(f"{self.admission.draining}; retry on another replica")
            if self.openai is not None and self.openai.owns(request.path):
                # in flight for the drain's wait_idle (a /v1 stream also holds a stream slot)
                self.admission.short += 1
                try:
                    return await self.openai.handle(request)
                finally:
                    self.admission.short -= 1
            return await self._handle(request)
        except FrontError as e:
            self.errors.record(f"http {e.status}", str(e))
            return web.json_response({"error": str(e)}, status=e.status)
        except (ConnectionResetError, asyncio.CancelledError):
            raise  # the client went away: nothing to answer
        except Exception as e:
            self.errors.record(
                f"http 500 {type(e).__name__}", f"{request.method} {shown(request.path)}: {e!r}"
            )
            return web.json_response(
                {"error": f"internal error in the front ({type(e).__name__})"}, status=500
            )

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        self._check_admin(request)
        model = _model_of(request.path)
        if model is not None:
            check_model_name(model)
        body = await self._read_body(request)
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in HOP_BY_HOP and k.lower() != self.admin_header
        }
        body = self._inflated(request, body, headers)
        if body:
            self._check_json(request, body)
        if model is not None and request.path.endswith("/infer"):
            await self._check_pins(request, model, body)
        body, headers = _with_parameters(request, body, headers)
        if request.path.endswith(STREAM_PATH_SUFFIX):
            return await self._forward_stream(request, headers, body)
        self.admission.short += 1
        try:
            return await self._forward(request, headers, body)
        finally:
            self.admission.short -= 1

    def _check_admin(self, request: web.BaseRequest) -> None:
        """403 for a restricted API called without the admin key (when there is one)."""
        if (
            self.admin_key is not None
            and self._restricted(request)
            and not admin_ok(request.headers.get(self.admin_header), self.admin_key)
        ):
            raise FrontError(
                f"this API is restricted: send the admin key in the {self.admin_header} header",
                403,
            )

    def _inflated(self, request: web.BaseRequest, body: bytes, headers: dict[str, str]) -> bytes:
        """``body`` inflated (bounded) when it is compressed, its ``Content-Encoding`` dropped
        from ``headers``; 415 for an encoding the front does not inflate."""
        encoding = request.headers.get("Content-Encoding", "").strip().lower()
        if not encoding or encoding == "identity":
            return body
        if encoding not in INFLATE_WBITS:
            raise FrontError(f"Content-Encoding {shown(encoding)} not supported", 415)
        headers.pop("Content-Encoding", None)
        headers.pop("content-encoding", None)
        return inflate(body, encoding, self.limits.max_body_bytes)

    async def _check_pins(self, request: web.BaseRequest, model: str, body: bytes) -> None:
        """400 when an inference pins a version (header or parameter) ``model`` cannot pin."""
        if request.headers.get(VERSION_HEADER) is not None:
            await self.check_pin(model, VERSION_HEADER)
        elif body and json_has_version(request.headers.get(LENGTH_HEADER), body):
            await self.check_pin(model, f"request parameter {VERSION_PARAMETER!r}")

    def _upstream(
        self, pool: str, request: web.BaseRequest, headers: dict[str, str], body: bytes
    ) -> Any:
        timeout = aiohttp.ClientTimeout(
            total=self.limits.request_timeout_s, connect=self.limits.queue_timeout_s
        )
        return self.session(pool).request(
            request.method,
            f"http://triton{request.rel_url.raw_path_qs}",
            headers=headers,
            data=body if body else None,
            timeout=timeout,
            allow_redirects=False,
        )

    def timeout_message(self) -> str:
        """Why a request got no answer in time (the bounds that ran out, by name)."""
        return (
            f"no answer from tritonserver within request_timeout_s="
            f"{self.limits.request_timeout_s:g} (or no free upstream connection within "
            f"queue_timeout_s={self.limits.queue_timeout_s:g})"
        )

    async def _forward(
        self, request: web.BaseRequest, headers: dict[str, str], body: bytes
    ) -> web.StreamResponse:
        try:
            async with self._upstream("short", request, headers, body) as upstream:
                out_headers = {
                    k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP
                }
                data = await upstream.read()
                if upstream.status == 200 and request.path.endswith("/infer"):
                    variant = degrade_headers.answered_variant(
                        data, upstream.headers.get(LENGTH_HEADER)
                    )
                    if variant is not None:
                        out_headers[degrade_headers.VARIANT_HEADER] = variant
                if (
                    self.admission.draining is not None
                    and upstream.status >= 400
                    and any(m in data.decode("utf-8", "replace") for m in _DRAIN_NOT_FOUND)
                ):
                    return _unavailable(f"{self.admission.draining}; retry later")
                return web.Response(status=upstream.status, headers=out_headers, body=data)
        except TimeoutError:
            return _unavailable(self.timeout_message())
        except (aiohttp.ClientError, OSError) as e:
            return _unavailable(f"tritonserver not reachable (restarting?): {type(e).__name__}")

    async def _forward_stream(
        self, request: web.BaseRequest, headers: dict[str, str], body: bytes
    ) -> web.StreamResponse:
        """A ``generate_stream`` SSE stream on the stream pool, holding one of the
        ``max_open_streams`` slots; a client that goes away closes the upstream stream at
        once (Triton cancels the request, the decode loop frees its slot at the next step);
        on drain the stream ends with an ``error`` event saying why."""
        ended: list[str] = []
        current: list[Any] = []

        def end(reason: str) -> None:
            ended.append(reason)
            for upstream in current:
                _close_upstream(upstream)

        token = self.admission.open_stream(end, _model_of(request.path))
        if token is None:
            return _unavailable(self.admission.full_message())
        response: web.StreamResponse | None = None
        try:
            async with self._upstream("stream", request, headers, body) as upstream:
                current.append(upstream)
                out_headers = {
                    k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP
                }
                if upstream.content_length is not None:  # an error before the stream began
                    data = await upstream.read()
                    return web.Response(status=upstream.status, headers=out_headers, body=data)
                response = web.StreamResponse(status=upstream.status, headers=out_headers)
                await response.prepare(request)
                watcher = asyncio.get_running_loop().create_task(_watch_client(request, upstream))
                try:
                    async for chunk in upstream.content.iter_any():
                        await response.write(chunk)
                except (aiohttp.ClientError, ConnectionResetError):
                    if _client_gone(request):
                        return response  # nobody to tell; the upstream stream is closed
                    if not ended:
                        ended.append("tritonserver closed the stream (restarting?)")
                finally:
                    watcher.cancel()
                with contextlib.suppress(aiohttp.ClientError, ConnectionResetError):
                    if ended:
                        await response.write(sse_event({"error": f"{ended[0]}: stream ended"}))
                    await response.write_eof()
                return response
        except TimeoutError:
            if response is None:
                return _unavailable(self.timeout_message())
            raise
        except (aiohttp.ClientError, OSError) as e:
            if response is None:
                return _unavailable(f"tritonserver not reachable (restarting?): {type(e).__name__}")
            raise ConnectionResetError(str(e)) from e
        finally:
            self.admission.close_stream(token)


def _with_parameters(
    request: web.BaseRequest, body: bytes, headers: dict[str, str]
) -> tuple[bytes, dict[str, str]]:
    """An inference's body and headers with the request parameters its headers ask for
    (``X-Model-Version``, ``X-Fallback``, ``X-Priority``; a parameter in the body wins)."""
    infer = bool(body) and request.path.endswith("/infer")
    version = request.headers.get(VERSION_HEADER)
    if version is not None and infer:
        body, length = apply_version_header(body, request.headers.get(LENGTH_HEADER), version)
        headers = _with_length(headers, length)
    asked = degrade_headers.header_parameters(
        request.headers.get(degrade_headers.FALLBACK_HEADER),
        request.headers.get(degrade_headers.PRIORITY_HEADER),
    )
    if asked and infer:
        length = next((v for k, v in headers.items() if k.lower() == LENGTH_HEADER.lower()), None)
        body, length = add_parameters(body, length, asked)
        headers = _with_length(headers, length)
    return body, headers


def _with_length(headers: dict[str, str], length: str | None) -> dict[str, str]:
    """``headers`` of a rewritten body: its new ``Inference-Header-Content-Length`` (none for
    plain JSON), no ``Content-Length`` (aiohttp sets it)."""
    out = {
        k: v
        for k, v in headers.items()
        if k.lower() not in (LENGTH_HEADER.lower(), "content-length")
    }
    if length is not None:
        out[LENGTH_HEADER] = length
    return out


async def _watch_client(request: web.BaseRequest, upstream: Any, poll_s: float = 0.2) -> None:
    """Close ``upstream`` once the client's connection is gone, even while the stream is silent
    (queued): Triton then cancels the request and the decode loop drops it at its next step."""
    while not _client_gone(request):
        await asyncio.sleep(poll_s)
    _close_upstream(upstream)


def _close_upstream(upstream: Any) -> None:
    """Close an upstream response now, waking a reader blocked on its body."""
    upstream.content.set_exception(aiohttp.ClientConnectionError("closed by the front"))
    upstream.close()


def _client_gone(request: web.BaseRequest) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def _unavailable(message: str) -> web.Response:
    return web.json_response({"error": message}, status=503, headers={"Retry-After": "1"})
