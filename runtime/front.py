"""The front: the only listener unauthenticated clients reach; Triton itself listens on private
Unix sockets.

Triton 2.51 has no HTTP or gRPC input-size limit (its gRPC server accepts 2 GiB messages), inflates
``Content-Encoding: gzip`` bodies without a bound and parses JSON recursively (a body nested 1M
levels deep crashes it), and its ``--*-restricted-api`` keys can only be passed on the command line
(world-readable in ``/proc/PID/cmdline``). So ``tritonserver`` binds ``unix:`` sockets inside a
0700 directory, and this front, in the launcher's process, listens on the public HTTP and gRPC
ports and, before Triton parses anything:

- refuses bodies over ``max_body_bytes`` (HTTP 413 from the ``Content-Length`` alone, or while
  reading a chunked body; gRPC ``RESOURCE_EXHAUSTED`` from grpcio's own receive limit);
- inflates gzip/deflate bodies itself with the same bound (stops at ``max_body_bytes + 1``
  decompressed bytes, so a 2 MB zip bomb costs 2 MB) and forwards them uncompressed;
- refuses JSON nested deeper than ``max_json_depth`` (400);
- checks the admin key on the restricted APIs (model repository, config, shared memory,
  statistics, trace, logging) with a constant-time compare;
- answers every request: an upstream that is restarting, saturated or silent past
  ``request_timeout_s`` gets the client a 503 / ``UNAVAILABLE``, never a hang.

aiohttp and grpcio do the protocol work (both ship with tritonclient); the front adds a lookup,
a length check and a byte scan per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import logging
import re
import threading
import time
import urllib.parse
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import grpc
from aiohttp import web
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from tritonforge.env import env_int
from tritonforge.headers import ADMIN_HEADER, GRPC_ADMIN_HEADER
from tritonforge.runtime import degrade_headers
from tritonforge.runtime.errors import FrontError, ServerStartError
from tritonforge.runtime.front_guard import (
    VERSION_PARAMETER,
    Admission,
    PinPolicy,
    ThrottledLog,
    check_model_name,
    parse_header_length,
    parse_version,
    shown,
)

if TYPE_CHECKING:
    from tritonforge.runtime.openai_front import OpenAIFront, OpenAISettings

log = logging.getLogger(__name__)

GRPC_SERVICE = "/inference.GRPCInferenceService/"
OPENAI_KEY_ENV = "TRITONFORGE_OPENAI_API_KEY"  # when set, /v1 needs `Authorization: Bearer`
# The first seed's header: pins a model version of a BLS pipeline (request parameter `version`).
VERSION_HEADER = "X-Model-Version"
LENGTH_HEADER = "Inference-Header-Content-Length"
GRPC_STREAMING = {f"{GRPC_SERVICE}ModelStreamInfer"}
TRACEPARENT_KEY = "traceparent"  # W3C trace context (gRPC metadata key)
_UPSTREAM_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
# The shared upstream channel: its own subchannel (gRPC's global pool would hand a refreshed
# channel the old one's connection, still in reconnect back-off after a restart: "tritonserver
# not reachable" after the supervisor reported the server back, found by test_launcher_lifecycle
# at load 30), and a back-off capped at 1 s on the local socket.
_SHARED_UPSTREAM_OPTIONS = [
    *_UPSTREAM_OPTIONS,
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
GRPC_INFER = f"{GRPC_SERVICE}ModelInfer"
GRPC_RESTRICTED = {
    GRPC_SERVICE + name
    for name in (
        "RepositoryIndex",
        "RepositoryModelLoad",
        "RepositoryModelUnload",
        "ModelConfig",
        "ModelStatistics",
        "SystemSharedMemoryStatus",
        "SystemSharedMemoryRegister",
        "SystemSharedMemoryUnregister",
        "CudaSharedMemoryStatus",
        "CudaSharedMemoryRegister",
        "CudaSharedMemoryUnregister",
        "TraceSetting",
        "LogSettings",
    )
}
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
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DEPTH_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
_INFLATE_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
_JSON_SHAPE = re.compile(rb'"shape"\s*:\s*\[([^\]]*)\]')
# Triton's private sockets in the socket directory: ``--grpc-address=unix:<dir>/grpc.sock`` listens
# on ``grpc.sock:<--grpc-port>`` (2.51 appends the port to the path); the HTTP socket is exact.
HTTP_SOCKET = "http.sock"
GRPC_SOCKET = "grpc.sock"
GRPC_SOCKET_PORT = 1
MAX_ELEMENTS = 2**31 - 1
"""Triton 2.51 truncates dims to 32 bits: ``[2**32 + 1, 1]`` passes as batch 1 (and skips the
max_batch_size check). Every dim, and every tensor's element count, must fit."""


def http_socket(socket_dir: Path) -> Path:
    """Triton's HTTP socket in ``socket_dir``."""
    return socket_dir / HTTP_SOCKET


def grpc_target(socket_dir: Path) -> str:
    """The gRPC channel target of Triton's socket in ``socket_dir``."""
    return f"unix:{socket_dir}/{GRPC_SOCKET}:{GRPC_SOCKET_PORT}"


def triton_listen_args(socket_dir: Path) -> list[str]:
    """tritonserver flags that make it listen (HTTP and gRPC) only on sockets in ``socket_dir``:
    the launcher's, and those of the container deployments (checked by deploy/validate/launcher.py)."""
    return [
        f"--http-address=unix:{http_socket(socket_dir)}",
        "--http-port=1",
        f"--grpc-address=unix:{socket_dir}/{GRPC_SOCKET}",
        f"--grpc-port={GRPC_SOCKET_PORT}",
    ]


def check_shape(dims: Iterable[int], where: str) -> None:
    """Raise :class:`FrontError` (400) for a negative dim or more than ``MAX_ELEMENTS``."""
    count = 1
    for d in dims:
        if not 0 <= d <= MAX_ELEMENTS:
            raise FrontError(f"{where}: shape dim {d} is outside [0, {MAX_ELEMENTS}]", 400)
        count *= d
        if count > MAX_ELEMENTS:
            raise FrontError(f"{where}: shape has more than {MAX_ELEMENTS} elements", 400)


def check_json_shapes(json_part: bytes) -> None:
    """Shape checks on an HTTP inference header: a regex finds the shapes (fast path); only a bad
    one costs a JSON parse, to name its tensor (the depth is already bounded)."""
    for m in _JSON_SHAPE.finditer(json_part):
        try:
            dims = [int(d) for d in m.group(1).split(b",") if d.strip()]
            check_shape(dims, "input")
        except ValueError:
            continue  # not integers: Triton's own parser answers that
        except FrontError:
            for tensor in _json_tensors(json_part):
                check_shape(tensor.get("shape", []), f"input {shown(str(tensor.get('name')))}")
            raise


def _json_tensors(json_part: bytes) -> list[dict[str, Any]]:
    try:
        inputs = json.loads(json_part).get("inputs", [])
    except (ValueError, AttributeError):
        return []
    return [t for t in inputs if isinstance(t, dict) and isinstance(t.get("shape"), list)]


def check_infer_message(message: bytes) -> service_pb2.ModelInferRequest:
    """Shape checks on a serialized gRPC ``ModelInferRequest`` (parsed by upb: microseconds);
    returns the parsed request."""
    try:
        request = service_pb2.ModelInferRequest.FromString(message)
    except DecodeError as e:
        raise FrontError(f"not a valid ModelInferRequest ({shown(str(e))})", 400) from e
    for tensor in request.inputs:
        check_shape(tensor.shape, f"input {shown(tensor.name)}")
    return request


def json_depth(data: bytes) -> int:
    """Deepest ``[``/``{`` nesting of a JSON text (brackets inside strings do not count)."""
    brackets = _JSON_STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    return max(itertools.accumulate(_DEPTH_STEP[b] for b in brackets))


def inflate(data: bytes, encoding: str, limit_bytes: int) -> bytes:
    """Decompress a gzip/deflate body, never producing more than ``limit_bytes`` + 1 bytes.

    Raises :class:`FrontError` when the result would exceed ``limit_bytes`` or the data is corrupt.
    """
    try:
        inflater = zlib.decompressobj(_INFLATE_WBITS[encoding])
        out = inflater.decompress(data, limit_bytes + 1)
    except zlib.error as e:
        raise FrontError(f"body is not valid {encoding} data ({e})", 400) from e
    if len(out) > limit_bytes or inflater.unconsumed_tail:
        raise FrontError(
            f"{encoding} body inflates past the {limit_bytes} byte limit (max_body_bytes)", 413
        )
    return out


def apply_version_header(
    body: bytes, header_length: str | None, value: str
) -> tuple[bytes, str | None]:
    """An inference body with ``X-Model-Version: N`` turned into the request parameter
    ``version`` (what the BLS reads to pin a model version); returns the new body and
    ``Inference-Header-Content-Length``. A parameter already in the body wins. Every value is
    parsed defensively: :class:`FrontError` (400) naming the header otherwise."""
    version = parse_version(value, VERSION_HEADER)
    split = (
        parse_header_length(header_length, len(body), LENGTH_HEADER)
        if header_length is not None
        else len(body)
    )
    try:
        header = json.loads(body[:split] or b"{}")
    except ValueError as e:
        raise FrontError(f"the inference request is not valid JSON: {shown(str(e))}", 400) from e
    if not isinstance(header, dict):
        raise FrontError("the inference request must be a JSON object", 400)
    params = header.setdefault("parameters", {})
    if not isinstance(params, dict):
        raise FrontError("'parameters' must be a JSON object", 400)
    params.setdefault("version", version)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    return encoded + body[split:], (str(len(encoded)) if header_length is not None else None)


def admin_ok(given: str | None, key: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), key.encode())


@dataclass(frozen=True)
class FrontLimits:
    """What the front bounds. ``max_body_bytes`` applies to the body as sent and inflated."""

    max_body_bytes: int = 2 * 1024 * 1024
    max_json_depth: int = 32
    request_timeout_s: float = 60.0
    queue_timeout_s: float = 10.0
    # Short requests in flight to Triton at once. Not a queue of its own: it must hold what the
    # models' queues and executing instances can (tests/unit/test_front_pool.py checks the specs),
    # so that Triton's bounded queues refuse a peak at once (503 "Exceeds maximum queue size")
    # and the BLS sees the backlog it degrades on. At 64 a 3x peak of 1-text requests waited
    # here for a connection (up to ``queue_timeout_s``): p50 3.3 s vs 0.8 s direct (issue #24).
    max_upstream_connections: int = 512
    idle_timeout_s: float = 75.0
    # On drain, gRPC calls in flight (open generation streams) get this long to finish before the
    # old upstream channel is closed; short against Triton's exit timeout, since a client that
    # keeps an idle stream open would otherwise hold tritonserver's shutdown.
    drain_grace_s: float = 10.0
    # Long-lived streams (SSE generate_stream and gRPC ModelStreamInfer together) open at once;
    # past it a new stream gets 503 / UNAVAILABLE. Streams use their own upstream pool, so short
    # requests keep max_upstream_connections to themselves.
    max_open_streams: int = 64


STREAM_PATH_SUFFIX = "/generate_stream"
PIN_POLICY_TTL_S = 30.0
SHUTTING_DOWN = "the server is shutting down"
_DRAIN_NOT_FOUND = ("has no available versions", "unknown model", "is not found")


def _model_of(path: str) -> str | None:
    """The model name of a ``/v2/models/<name>/...`` path (None for other paths)."""
    parts = path.split("/")
    return parts[3] if len(parts) > 3 and parts[1:3] == ["v2", "models"] else None


def _json_has_version(header_length: str | None, body: bytes) -> bool:
    """Whether an (already checked) inference header sets the ``version`` parameter."""
    part = body[: int(header_length)] if header_length is not None else body
    if b'"version"' not in part:
        return False
    try:
        params = json.loads(part).get("parameters")
    except (ValueError, AttributeError):
        return False
    return isinstance(params, dict) and VERSION_PARAMETER in params


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
                return await self.openai.handle(request)
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
        if (
            self.admin_key is not None
            and self._restricted(request)
            and not admin_ok(request.headers.get(self.admin_header), self.admin_key)
        ):
            raise FrontError(
                f"this API is restricted: send the admin key in the {self.admin_header} header",
                403,
            )
        model = _model_of(request.path)
        if model is not None:
            check_model_name(model)
        body = await self._read_body(request)
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in HOP_BY_HOP and k.lower() != self.admin_header
        }
        encoding = request.headers.get("Content-Encoding", "").strip().lower()
        if encoding and encoding != "identity":
            if encoding not in _INFLATE_WBITS:
                raise FrontError(f"Content-Encoding {shown(encoding)} not supported", 415)
            body = inflate(body, encoding, self.limits.max_body_bytes)
            headers.pop("Content-Encoding", None)
            headers.pop("content-encoding", None)
        if body:
            self._check_json(request, body)
        version = request.headers.get(VERSION_HEADER)
        if model is not None and request.path.endswith("/infer"):
            if version is not None:
                await self.check_pin(model, VERSION_HEADER)
            elif body and _json_has_version(request.headers.get(LENGTH_HEADER), body):
                await self.check_pin(model, f"request parameter {VERSION_PARAMETER!r}")
        if version is not None and body and request.path.endswith("/infer"):
            length = request.headers.get(LENGTH_HEADER)
            body, length = apply_version_header(body, length, version)
            headers = {
                k: v
                for k, v in headers.items()
                if k.lower() not in (LENGTH_HEADER.lower(), "content-length")
            }
            if length is not None:
                headers[LENGTH_HEADER] = length
        asked = degrade_headers.header_parameters(
            request.headers.get(degrade_headers.FALLBACK_HEADER),
            request.headers.get(degrade_headers.PRIORITY_HEADER),
        )
        if asked and body and request.path.endswith("/infer"):
            length = next(
                (v for k, v in headers.items() if k.lower() == LENGTH_HEADER.lower()), None
            )
            body, length = degrade_headers.add_parameters(body, length, asked)
            headers = {
                k: v
                for k, v in headers.items()
                if k.lower() not in (LENGTH_HEADER.lower(), "content-length")
            }
            if length is not None:
                headers[LENGTH_HEADER] = length
        if request.path.endswith(STREAM_PATH_SUFFIX):
            return await self._forward_stream(request, headers, body)
        self.admission.short += 1
        try:
            return await self._forward(request, headers, body)
        finally:
            self.admission.short -= 1

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

    def _timeout_message(self) -> str:
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
            return _unavailable(self._timeout_message())
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
                return _unavailable(self._timeout_message())
            raise
        except (aiohttp.ClientError, OSError) as e:
            if response is None:
                return _unavailable(f"tritonserver not reachable (restarting?): {type(e).__name__}")
            raise ConnectionResetError(str(e)) from e
        finally:
            self.admission.close_stream(token)


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


def _goodbye(reason: str) -> bytes:
    """The last message of a gRPC stream ended by the front: an in-stream error saying why."""
    return service_pb2.ModelStreamInferResponse(
        error_message=f"{reason}: stream ended"
    ).SerializeToString()


class GrpcFront(grpc.GenericRpcHandler):
    """grpc.aio server forwarding raw messages to Triton's gRPC Unix socket (no re-encoding).

    Streams (``ModelStreamInfer``) hold one of the ``max_open_streams`` slots (UNAVAILABLE past
    the bound); a client that cancels or whose deadline passes cancels the upstream call at once."""

    def __init__(
        self,
        upstream_target: Callable[[], str],
        admin_key: str | None,
        admin_headers: Iterable[str],
        limits: FrontLimits,
        admission: Admission | None = None,
        errors: ThrottledLog | None = None,
        pins: Callable[[str, str], Awaitable[None]] | None = None,
        traced: bool = False,
    ) -> None:
        """``pins(model, field)`` raises :class:`FrontError` when ``model`` cannot pin.
        ``traced``: tritonserver exports OpenTelemetry spans, so a unary call carrying a
        ``traceparent`` goes over a channel of its own (:meth:`unary_channel`)."""
        self.upstream_target = upstream_target
        self.admin_key = admin_key
        self.admin_headers = tuple(h.lower() for h in admin_headers)
        self.limits = limits
        self.admission = admission or Admission(limits.max_open_streams)
        self.errors = errors or ThrottledLog(log)
        self.pins = pins
        self.traced = traced
        self._channel: grpc.aio.Channel | None = None
        self._channel_target = ""

    def channel(self) -> grpc.aio.Channel:
        target = self.upstream_target()
        if self._channel is None or self._channel_target != target:
            if self._channel is not None:
                asyncio.get_running_loop().create_task(self._channel.close())
            self._channel = grpc.aio.insecure_channel(target, options=_SHARED_UPSTREAM_OPTIONS)
            self._channel_target = target
        return self._channel

    @contextlib.asynccontextmanager
    async def unary_channel(
        self, metadata: tuple[tuple[str, str], ...]
    ) -> AsyncIterator[grpc.aio.Channel]:
        """The shared upstream channel, or, when tracing is on and the call carries a
        ``traceparent``, a channel opened for this call alone.

        Why: Triton 2.51 intermittently ignores the ``traceparent`` of calls multiplexed on one
        long-lived HTTP/2 connection (measured through the front: 5 of 30 gRPC calls exported
        under a fresh, parentless trace; 0 of 30 with a connection per client, 0 of 80 with a
        connection per traced call; HTTP never). Its gRPC carrier appears to read the metadata
        value past its end (a ``string_ref`` taken as a C string), which then fails the W3C
        length check depending on what follows in the connection's buffers. A fresh connection
        costs a Unix-socket connect per traced call, only while tracing is on."""
        if not (self.traced and any(k == TRACEPARENT_KEY for k, _ in metadata)):
            yield self.channel()
            return
        # A local subchannel pool: otherwise gRPC hands this channel the shared one's connection.
        options = [*_UPSTREAM_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
        channel = grpc.aio.insecure_channel(self.upstream_target(), options=options)
        try:
            yield channel
        finally:
            await channel.close()

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close(grace=None)

    def detach(self, grace_s: float) -> None:
        """Hand new calls a fresh channel; let the calls in flight on the current one (open
        streams) finish within ``grace_s`` before it is closed. Closing it at once cancelled
        every open stream when tritonserver was asked to drain."""
        old, self._channel = self._channel, None
        if old is not None:
            asyncio.get_running_loop().create_task(old.close(grace=grace_s))

    async def _abort(self, context: Any, code: grpc.StatusCode, details: str) -> None:
        if code not in (grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED):
            self.errors.record(f"grpc {code.name}", details)
        await context.abort(code, details)

    async def _refuse_when_draining(self, context: Any) -> None:
        if self.admission.draining is not None:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"{self.admission.draining}; retry on another replica",
            )

    async def _checked_message(self, message: bytes) -> str:
        """The model a request message goes to, once it passed the checks."""
        request = check_infer_message(message)
        check_model_name(request.model_name, "model_name")
        if VERSION_PARAMETER in request.parameters and self.pins is not None:
            await self.pins(request.model_name, f"request parameter {VERSION_PARAMETER!r}")
        return str(request.model_name)

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method
        if method in GRPC_STREAMING:

            async def stream(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
                # an async generator function: grpc.aio treats anything else as synchronous
                async with contextlib.aclosing(self._stream(method, requests, context)) as out:
                    async for response in out:
                        yield response

            return grpc.stream_stream_rpc_method_handler(stream)

        async def unary(request: bytes, context: Any) -> bytes:
            await self._refuse_when_draining(context)
            self.admission.short += 1
            try:
                return await self._unary(method, request, context)
            finally:
                self.admission.short -= 1

        return grpc.unary_unary_rpc_method_handler(unary)

    async def _stream(
        self, method: str, requests: AsyncIterator[bytes], context: Any
    ) -> AsyncGenerator[bytes, None]:
        await self._refuse_when_draining(context)
        metadata = await self._metadata(method, context)
        ended: list[str] = []
        calls: list[Any] = []

        def end(reason: str) -> None:
            ended.append(reason)
            for call in calls:
                call.cancel()

        token = self.admission.open_stream(end)
        if token is None:
            await self._abort(context, grpc.StatusCode.UNAVAILABLE, self.admission.full_message())
        bad: list[FrontError] = []

        async def checked() -> AsyncIterator[bytes]:
            async for message in requests:
                try:
                    model = await self._checked_message(message)
                    self.admission.stream_model(token, model)
                except FrontError as e:
                    bad.append(e)
                    for call in calls:
                        call.cancel()
                    return
                yield message

        call = self.channel().stream_stream(method)(
            checked(), metadata=metadata, timeout=context.time_remaining()
        )
        calls.append(call)
        try:
            try:
                async for response in call:
                    yield response
            except (grpc.aio.AioRpcError, asyncio.CancelledError) as e:
                if bad:
                    await self._abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(bad[0]))
                if ended:
                    yield _goodbye(ended[0])
                    return
                if isinstance(e, asyncio.CancelledError):
                    raise
                await self._abort(context, e.code(), e.details() or "")
            if bad:
                await self._abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(bad[0]))
        finally:
            call.cancel()  # a client that cancelled or timed out: Triton cancels the request
            self.admission.close_stream(token)

    async def _unary(self, method: str, request: bytes, context: Any) -> bytes:
        metadata = await self._metadata(method, context)
        if method == GRPC_INFER:
            try:
                await self._checked_message(request)
            except FrontError as e:
                await self._abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
        remaining = context.time_remaining()
        timeout = self.limits.request_timeout_s
        if remaining is not None:
            timeout = min(timeout, remaining)
        try:
            async with self.unary_channel(metadata) as channel:
                return bytes(
                    await channel.unary_unary(method)(request, metadata=metadata, timeout=timeout)
                )
        except grpc.aio.AioRpcError as e:
            code = e.code()
            details = e.details() or ""
            if code == grpc.StatusCode.DEADLINE_EXCEEDED and (
                remaining is None or remaining > timeout
            ):
                code, details = (
                    grpc.StatusCode.UNAVAILABLE,
                    (
                        f"no answer from tritonserver within request_timeout_s="
                        f"{self.limits.request_timeout_s:g}"
                    ),
                )
            elif code == grpc.StatusCode.UNAVAILABLE and "connect" in details.lower():
                details = "tritonserver not reachable (restarting?)"
            elif code == grpc.StatusCode.NOT_FOUND and self.admission.draining is not None:
                code, details = grpc.StatusCode.UNAVAILABLE, f"{self.admission.draining}"
            await self._abort(context, code, details)
            raise  # unreachable: abort raises

    async def _metadata(self, method: str, context: Any) -> tuple[tuple[str, str], ...]:
        """The caller's metadata minus reserved keys and the admin key; aborts the call with
        PERMISSION_DENIED when a restricted method lacks the key."""
        metadata = tuple(
            (k, v)
            for k, v in context.invocation_metadata() or ()
            if not k.startswith((":", "grpc-")) and k not in ("user-agent", *self.admin_headers)
        )
        if method in GRPC_RESTRICTED and self.admin_key is not None:
            given = dict(context.invocation_metadata() or ())
            if not any(admin_ok(given.get(h), self.admin_key) for h in self.admin_headers):
                await context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"this API is restricted: send the admin key in the "
                    f"{self.admin_headers[0]} metadata",
                )
        return metadata


class Front:
    """Both fronts on one asyncio loop in a daemon thread of the launcher.

    ``start()`` binds the public ports (raising :class:`ServerStartError` naming the flag when one is
    taken) before tritonserver starts; ``stop()`` closes them. The upstream paths are read per
    request, so a restarted tritonserver is picked up without rebinding.
    """

    def __init__(
        self,
        host: str,
        http_port: int,
        grpc_port: int,
        http_socket: Callable[[], Path],
        grpc_target: Callable[[], str],
        admin_key: str | None,
        admin_header: str,
        grpc_admin_headers: Iterable[str],
        limits: FrontLimits | None = None,
        openai: OpenAISettings | None = None,
        traced: bool = False,
    ) -> None:
        self.host = host
        self.http_port = http_port
        self.grpc_port = grpc_port
        self.limits = limits or FrontLimits()
        self.admission = Admission(self.limits.max_open_streams)
        self.errors = ThrottledLog(log)
        self.http = HttpFront(
            http_socket,
            admin_key,
            admin_header.lower(),
            self.limits,
            self.admission,
            self.errors,
        )
        self.grpc = GrpcFront(
            grpc_target,
            admin_key,
            grpc_admin_headers,
            self.limits,
            self.admission,
            self.errors,
            pins=self.http.check_pin,
            traced=traced,
        )
        if openai is not None:
            from tritonforge.runtime.openai_front import OpenAIFront

            self.http.openai = OpenAIFront(self.http, self.grpc.channel, openai)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="front", daemon=True)
        self._runner: web.ServerRunner | None = None
        self._grpc_server: grpc.aio.Server | None = None

    def start(self) -> Front:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        try:
            future.result(timeout=30)
        except BaseException:
            self.stop()
            raise
        return self

    async def _start(self) -> None:
        server = web.Server(
            self.http.handle,
            auto_decompress=False,
            keepalive_timeout=self.limits.idle_timeout_s,
            max_field_size=16384,
        )
        self._runner = web.ServerRunner(server, handle_signals=False)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self.host, self.http_port, reuse_address=True).start()
            self.http_port = int(self._runner.addresses[0][1])  # the bound one (0: any free)
        except OSError as e:
            raise ServerStartError(
                f"cannot listen on {self.host}:{self.http_port} for HTTP ({e.strerror}); pass "
                "--http-port or set TRITONFORGE_HTTP_PORT"
            ) from e
        self._grpc_server = grpc.aio.server(
            handlers=[self.grpc],
            options=[
                ("grpc.max_receive_message_length", self.limits.max_body_bytes),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0),
            ],
        )
        bound = 0
        with contextlib.suppress(RuntimeError):
            bound = self._grpc_server.add_insecure_port(f"{self.host}:{self.grpc_port}")
        if not bound:
            raise ServerStartError(
                f"cannot listen on {self.host}:{self.grpc_port} for gRPC (port taken?); pass "
                "--grpc-port or set TRITONFORGE_GRPC_PORT"
            )
        self.grpc_port = bound
        await self._grpc_server.start()

    async def _stop(self) -> None:
        self.errors.flush()
        if self._grpc_server is not None:
            await self._grpc_server.stop(grace=1.0)
        if self._runner is not None:
            await self._runner.cleanup()
        await self.http.close()
        await self.grpc.close()

    def release_upstream(self) -> None:
        """Close the idle keep-alive connections to tritonserver (they would hold its shutdown
        until ``--exit-timeout-secs``); new requests open fresh ones."""
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._release(), self._loop).result(timeout=5)

    async def _release(self) -> None:
        await self.http.close()
        self.grpc.detach(grace_s=self.limits.drain_grace_s)

    def begin_drain(self, reason: str = SHUTTING_DOWN) -> None:
        """Stop accepting: from now on every request gets 503 / UNAVAILABLE naming ``reason``
        (never reaching tritonserver, so never its NOT_FOUND of a model being unloaded), and
        every open stream ends with a last message saying why."""
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._begin_drain(reason), self._loop).result(5)

    async def _begin_drain(self, reason: str) -> None:
        self.admission.begin_drain(reason)

    def end_streams(
        self, models: Iterable[str], reason: str, opened_before_s: float | None = None
    ) -> int:
        """End the open streams to ``models`` (opened before ``opened_before_s``, monotonic,
        when given) with a last message saying ``reason`` (:meth:`Admission.end_streams`); how
        many. The supervisor calls it when a stub died: its decoupled requests never end."""
        if not self._thread.is_alive():
            return 0
        wanted = list(models)

        async def end() -> int:
            return self.admission.end_streams(wanted, reason, opened_before_s)

        with contextlib.suppress(Exception):
            return asyncio.run_coroutine_threadsafe(end(), self._loop).result(timeout=5)
        return 0

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is in flight through the front (short requests finished,
        streams ended); False at the timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self._thread.is_alive() or self.admission.idle():
                return True
            time.sleep(0.05)
        return self.admission.idle()

    def stop(self) -> None:
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=15)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        if not self._loop.is_running():
            self._loop.close()


def _true_or_false(value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise ValueError(f"true or false, not {value[:16]!r}")
    return value.lower() == "true"


def main(argv: list[str] | None = None) -> int:
    """``python -m tritonforge.runtime front``: the front alone, before a tritonserver started elsewhere with
    ``--http-address=unix:<dir>/http.sock --http-port=1 --grpc-address=unix:<dir>/grpc.sock
    --grpc-port=1`` (:func:`triton_listen_args`; a sidecar sharing ``<dir>``: docker-compose.yml,
    deploy/k8s). The admin key comes from the environment
    variable named by ``--admin-key-env`` (never from the command line)."""
    import argparse
    import os
    import signal

    p = argparse.ArgumentParser(
        prog="python -m tritonforge.runtime front", description=main.__doc__
    )
    p.add_argument("--host", default=os.environ.get("TRITONFORGE_HOST", "127.0.0.1"))
    p.add_argument("--http-port", type=int, default=env_int("TRITONFORGE_HTTP_PORT", 8000))
    p.add_argument("--grpc-port", type=int, default=env_int("TRITONFORGE_GRPC_PORT", 8001))
    p.add_argument("--socket-dir", type=Path, required=True, help="where Triton's sockets are")
    p.add_argument("--admin-key-env", default="TRITONFORGE_ADMIN_KEY")
    p.add_argument(
        "--model-repository",
        type=Path,
        default=os.environ.get("TRITONFORGE_MODEL_REPOSITORY"),
        help="the served repository (read-only): turns on the OpenAI-compatible /v1 routes",
    )
    p.add_argument(
        "--traced",
        type=_true_or_false,
        default=False,
        metavar="true|false",
        help="tritonserver exports OpenTelemetry spans (its --trace-config=mode=opentelemetry): "
        "each traced gRPC call gets its own upstream connection (GrpcFront.unary_channel)",
    )
    defaults = FrontLimits()
    for name, value in vars(defaults).items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    args = p.parse_args(argv)
    import secrets

    given = os.environ.get(args.admin_key_env)
    key = given or secrets.token_urlsafe(18)  # no key set: nobody can call the admin APIs
    limits = FrontLimits(**{name: getattr(args, name) for name in vars(defaults)})
    front = Front(
        args.host,
        args.http_port,
        args.grpc_port,
        http_socket=lambda: http_socket(args.socket_dir),
        grpc_target=lambda: grpc_target(args.socket_dir),
        admin_key=key,
        admin_header=ADMIN_HEADER,
        grpc_admin_headers=(GRPC_ADMIN_HEADER, ADMIN_HEADER),
        limits=limits,
        openai=openai_settings(args.model_repository, os.environ.get(OPENAI_KEY_ENV)),
        traced=args.traced,
    )
    try:
        front.start()
    except ServerStartError as e:
        log.error("%s", e)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    log.info(
        f"==> front on {args.host}: HTTP {front.http_port}, gRPC {front.grpc_port} -> "
        f"{args.socket_dir} (admin APIs {'need $' + args.admin_key_env if given else 'closed: no key set'})"
    )
    stop.wait()
    front.stop()
    return 0


def openai_settings(
    model_repository: Path | None, api_key: str | None = None
) -> OpenAISettings | None:
    """The ``/v1`` settings for a front serving ``model_repository`` (None: no ``/v1``)."""
    if model_repository is None:
        return None
    from tritonforge.runtime.openai_front import OpenAISettings

    return OpenAISettings(Path(model_repository), api_key=api_key or None)
