"""The front's HTTP relay: an aiohttp handler forwarding to Triton's HTTP Unix socket, after the
body bounds and checks (:mod:`runtime.front.body`), the admin key check on the restricted APIs and
the headers turned into request parameters; ``generate_stream`` is served by the front itself
over Triton's gRPC (:mod:`runtime.front.sse`), so open streams hold no Triton HTTP thread."""

from __future__ import annotations

import asyncio
import logging
import re
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import grpc
from aiohttp import web

from tritonforge.errors import shown
from tritonforge.runtime.errors import FrontError
from tritonforge.runtime.front import degrade_headers, sse_relay
from tritonforge.runtime.front.body import (
    INFLATE_WBITS,
    add_parameters,
    apply_version_header,
    check_json_shapes,
    inflate,
    json_depth,
    json_has_version,
    read_body,
)
from tritonforge.runtime.front.capacity import ConfigReader, QueueCapacity, StreamCapacity
from tritonforge.runtime.front.guard import (
    LENGTH_HEADER,
    QUEUE_PRIORITY_KEY,
    VERSION_HEADER,
    VERSION_PARAMETER,
    Admission,
    PinPolicy,
    ThrottledLog,
    admin_ok,
    check_model_name,
    parse_header_length,
)
from tritonforge.runtime.front.queues import QueueFullError
from tritonforge.runtime.front.session import prioritized_body
from tritonforge.runtime.front.settings import FrontLimits
from tritonforge.runtime.front.sse_relay import DRAIN_NOT_FOUND
from tritonforge.runtime.front.sse_relay import unavailable as _unavailable

if TYPE_CHECKING:
    from tritonforge.runtime.front.openai.app import OpenAIFront

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
GENERATE_PATH_SUFFIX = "/generate"
PIN_POLICY_TTL_S = 30.0
SHUTTING_DOWN = "the server is shutting down"


def _model_of(path: str) -> str | None:
    """The model name of a ``/v2/models/<name>/...`` path (None for other paths)."""
    parts = path.split("/")
    return parts[3] if len(parts) > 3 and parts[1:3] == ["v2", "models"] else None


class HttpFront:
    """aiohttp server on ``host:port`` forwarding to Triton's HTTP Unix socket.

    Short requests go over HTTP; ``generate_stream`` streams over Triton's gRPC
    (``grpc_channel``), so open streams never take a connection or a Triton HTTP thread a short
    request needs; streams are bounded per model by ``admission`` (503 past the bound)."""

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
        self.openai: OpenAIFront | None = None  # the /v1 routes (runtime/front/openai/app.py)
        # Triton's gRPC upstream (GrpcFront.channel): generate_stream streams over it
        self.grpc_channel: Callable[[], grpc.aio.Channel] | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._pins: tuple[Path, float, PinPolicy] | None = None
        self._pins_lock: asyncio.Lock | None = None
        admin = {admin_header: admin_key} if admin_key else {}
        # each model's stream bound, read once from its served config (the relays' admission)
        self.stream_capacity = StreamCapacity(
            self.admission,
            ConfigReader(upstream_socket, self.session, admin, limits.queue_timeout_s),
        )
        # each model's bounded queues, read once from the served configs: inferences (v2
        # /infer here, gRPC ModelInfer, the /v1 routes) hold a slot of each; an ensemble's are
        # refused past them (core#466, runtime.front.queues)
        self.queue_capacity = QueueCapacity(
            self.admission.queues,
            ConfigReader(upstream_socket, self.session, admin, limits.queue_timeout_s),
            enabled=limits.model_queue_admission,
        )

    def session(self, pool: str = "short") -> aiohttp.ClientSession:
        """The upstream session (short requests; streams go over gRPC), reopened after a
        restart."""
        path = self.upstream_socket()
        if self._session_socket != path:
            self._drop_sessions()
            self._session_socket = path
        session = self._sessions.get(pool)
        if session is None:
            limit = self.limits.max_upstream_connections
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
        if self._pins_lock is None:
            self._pins_lock = asyncio.Lock()
        async with self._pins_lock:  # a burst of streams fetches the configs once
            return await self._fetch_pin_policy()

    async def _fetch_pin_policy(self) -> PinPolicy | None:
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
        body = await read_body(request, self.limits.max_body_bytes)
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
        body, headers = _with_priority(request, body, headers)
        if request.path.endswith(STREAM_PATH_SUFFIX):
            return await sse_relay.forward_stream(self, request, headers, body)
        self.admission.short += 1
        try:
            if model is not None and request.path.endswith(GENERATE_PATH_SUFFIX):
                return await self._forward_generate(request, headers, body, model)
            if model is not None and request.path.endswith("/infer"):
                async with self.queue_capacity.slot(model):
                    return await self._forward(request, headers, body)
            return await self._forward(request, headers, body)
        except QueueFullError as e:
            self.errors.record("http 503 queue full", str(e))
            return _unavailable(str(e))
        finally:
            self.admission.short -= 1

    async def _forward_generate(
        self, request: web.BaseRequest, headers: dict[str, str], body: bytes, model: str
    ) -> web.StreamResponse:
        """A non-streamed v2 ``generate``: Triton answers it after the model's last response,
        so it is in flight for a whole generation; it is tracked like a stream
        (:meth:`Admission.track`), so that the supervisor (a crashed stub never sends that last
        response) and the drain end it with a 503 saying why instead of ``request_timeout_s``."""
        reasons: list[str] = []
        forward = asyncio.ensure_future(self._forward(request, headers, body))

        def end(reason: str) -> None:
            reasons.append(reason)
            forward.cancel()

        token = self.admission.track(end, model)
        try:
            return await forward
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not reasons or (task is not None and task.cancelling()):
                raise
            return _unavailable(f"{reasons[0]}: request ended")
        finally:
            forward.cancel()
            self.admission.close_stream(token)

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
                    and any(m in data.decode("utf-8", "replace") for m in DRAIN_NOT_FOUND)
                ):
                    return _unavailable(f"{self.admission.draining}; retry later")
                return web.Response(status=upstream.status, headers=out_headers, body=data)
        except TimeoutError:
            return _unavailable(self.timeout_message())
        except (aiohttp.ClientError, OSError) as e:
            return _unavailable(f"tritonserver not reachable (restarting?): {type(e).__name__}")


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


def _with_priority(
    request: web.BaseRequest, body: bytes, headers: dict[str, str]
) -> tuple[bytes, dict[str, str]]:
    """A non-streamed ``/infer`` or ``/generate`` with the tenant's queue priority
    (:func:`~runtime.front.session.prioritized_body`; streams get it from their session)."""
    generate = request.path.endswith(GENERATE_PATH_SUFFIX)
    if not (generate or request.path.endswith("/infer")) or _model_of(request.path) is None:
        return body, headers
    length = next((v for k, v in headers.items() if k.lower() == LENGTH_HEADER.lower()), None)
    out, new_length = prioritized_body(generate, body, length, request.get(QUEUE_PRIORITY_KEY))
    return (body, headers) if out is body else (out, _with_length(headers, new_length))


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
