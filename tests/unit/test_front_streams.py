"""The gRPC front's stream handling against a stand-in upstream (a plain grpc server on a Unix
socket that streams forever and records cancellation): the integration tests run the same
promises against the real Triton; the SSE ones use a stand-in aiohttp upstream. Issue #19
findings 2b (bound, separate pools), 4 (cancel, disconnect), 5 (drain)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp import web
from tritonclient.grpc import service_pb2

from tritonforge.runtime.front import GRPC_INFER, GRPC_SERVICE, Front, FrontLimits
from tritonforge.runtime.settings import free_port

STREAM = f"{GRPC_SERVICE}ModelStreamInfer"


class Upstream(grpc.GenericRpcHandler):
    """Streams a response every 20 ms until cancelled; ModelInfer answers NOT_FOUND."""

    def __init__(self) -> None:
        self.cancelled = threading.Semaphore(0)
        self.open = 0

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if details.method == STREAM:
            return grpc.stream_stream_rpc_method_handler(self._stream)
        if details.method == GRPC_INFER:
            return grpc.unary_unary_rpc_method_handler(self._infer)
        return None

    def _stream(self, requests: Iterator[bytes], context: Any) -> Iterator[bytes]:
        next(requests)
        context.add_callback(self.cancelled.release)
        self.open += 1
        response = service_pb2.ModelStreamInferResponse().SerializeToString()
        try:
            while context.is_active():
                yield response
                time.sleep(0.02)
        finally:
            self.open -= 1

    def _infer(self, request: bytes, context: Any) -> bytes:
        context.abort(
            grpc.StatusCode.NOT_FOUND, "Request for unknown model: 'm' has no available versions"
        )
        return b""


@pytest.fixture
def front(tmp_path: Path) -> Iterator[tuple[Front, Upstream]]:
    upstream = Upstream()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), handlers=[upstream])
    target = f"unix:{tmp_path}/up.sock"
    server.add_insecure_port(target)
    server.start()
    f = Front(
        "127.0.0.1",
        free_port(),
        free_port(),
        http_socket=lambda: tmp_path / "absent.sock",
        grpc_target=lambda: target,
        admin_key=None,
        admin_header="x-admin",
        grpc_admin_headers=("x-admin",),
        limits=FrontLimits(max_open_streams=2),
    ).start()
    try:
        yield f, upstream
    finally:
        f.stop()
        server.stop(grace=None)


def request(model: str = "generate") -> bytes:
    return service_pb2.ModelInferRequest(model_name=model).SerializeToString()


def open_stream(f: Front, model: str = "generate") -> tuple[grpc.Channel, Any]:
    channel = grpc.insecure_channel(f"127.0.0.1:{f.grpc_port}")
    call = channel.stream_stream(STREAM)(iter([request(model)]), timeout=30)
    return channel, call


def test_a_cancelled_client_stream_cancels_upstream_at_once(front: tuple[Front, Upstream]) -> None:
    f, upstream = front
    channel, call = open_stream(f)
    next(call), next(call)
    call.cancel()
    assert upstream.cancelled.acquire(timeout=5), "the upstream stream was never cancelled"
    channel.close()


def test_streams_past_the_bound_are_unavailable(front: tuple[Front, Upstream]) -> None:
    f, _ = front
    opened = [open_stream(f) for _ in range(2)]
    for _, call in opened:
        next(call)
    channel, third = open_stream(f)
    with pytest.raises(grpc.RpcError) as err:
        next(third)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "max_open_streams=2" in (err.value.details() or "")
    for ch, call in [*opened, (channel, third)]:
        call.cancel()
        ch.close()


def test_drain_ends_open_streams_with_a_reason_and_refuses_new_calls(
    front: tuple[Front, Upstream],
) -> None:
    f, upstream = front
    channel, call = open_stream(f)
    next(call)
    f.begin_drain()
    last = None
    for message in call:  # ends: the front's last message says why
        last = service_pb2.ModelStreamInferResponse.FromString(message)
    assert last is not None and "shutting down" in last.error_message
    assert upstream.cancelled.acquire(timeout=5)
    with pytest.raises(grpc.RpcError) as err:
        channel.unary_unary(GRPC_INFER)(request(), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE  # never Triton's NOT_FOUND
    assert f.wait_idle(timeout_s=5)
    channel.close()


def test_end_streams_ends_only_the_streams_to_those_models_with_a_reason(
    front: tuple[Front, Upstream],
) -> None:
    """Chaos finding: a decoupled model whose stub died never ends the streams it held (the
    supervisor calls this): the streams to it get a last message saying why, the others and
    new streams go on."""
    f, upstream = front
    gen_channel, gen = open_stream(f, "generate")
    other_channel, other = open_stream(f, "other")
    next(gen), next(other)
    assert f.end_streams(["generate"], "generate crashed and is reloading; retry") == 1
    last = None
    for message in gen:
        last = service_pb2.ModelStreamInferResponse.FromString(message)
    assert last is not None
    assert last.error_message == "generate crashed and is reloading; retry: stream ended"
    assert upstream.cancelled.acquire(timeout=5)
    next(other), next(other)  # untouched
    assert f.end_streams(["generate"], "again", opened_before_s=0.0) == 0
    after = time.monotonic()
    new_channel, new = open_stream(f, "generate")
    next(new)  # a stream opened later is not ended by a call about earlier ones
    assert f.end_streams(["generate"], "late", opened_before_s=after) == 0
    for channel, call in ((other_channel, other), (new_channel, new), (gen_channel, gen)):
        call.cancel()
        channel.close()


class SseUpstream:
    """An aiohttp server on a Unix socket: ``generate_stream`` sends an event every 20 ms until
    the front closes the connection (recorded), ``/v2/health/ready`` answers at once."""

    def __init__(self, path: Path) -> None:
        self.path, self.gone = path, threading.Semaphore(0)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v2/models/generate/generate_stream", self._stream)
        app.router.add_get("/v2/health/ready", lambda _: web.Response(text=""))
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.UnixSite(self.runner, str(self.path)).start()

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            while True:
                await response.write(b'data: {"text_output":"x"}\n\n')
                await asyncio.sleep(0.02)
        except (ConnectionResetError, asyncio.CancelledError):
            self.gone.release()
        return response

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture
def sse_front(tmp_path: Path) -> Iterator[tuple[Front, SseUpstream]]:
    upstream = SseUpstream(tmp_path / "http.sock")
    f = Front(
        "127.0.0.1",
        free_port(),
        free_port(),
        http_socket=lambda: upstream.path,
        grpc_target=lambda: f"unix:{tmp_path}/absent.sock",
        admin_key=None,
        admin_header="x-admin",
        grpc_admin_headers=("x-admin",),
        limits=FrontLimits(max_open_streams=2, max_upstream_connections=1),
    ).start()
    try:
        yield f, upstream
    finally:
        f.stop()
        upstream.stop()


def sse(f: Front) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", f.http_port), timeout=30)
    sock.sendall(
        b"POST /v2/models/generate/generate_stream HTTP/1.1\r\nHost: x\r\n"
        b"Content-Length: 2\r\n\r\n{}"
    )
    seen = b""
    while b"data:" not in seen:
        seen += sock.recv(4096)
    return sock


def get(f: Front, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{f.http_port}{path}", timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_sse_streams_are_bounded_and_leave_short_requests_their_pool(
    sse_front: tuple[Front, SseUpstream],
) -> None:
    f, _ = sse_front
    socks = [sse(f), sse(f)]  # more streams than short-request connections (1)
    assert get(f, "/v2/health/ready")[0] == 200
    request = urllib.request.Request(
        f"http://127.0.0.1:{f.http_port}/v2/models/generate/generate_stream", data=b"{}"
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 503 and b"max_open_streams=2" in refused.value.read()
    for sock in socks:
        sock.close()


def test_an_sse_client_that_leaves_closes_the_upstream_stream(
    sse_front: tuple[Front, SseUpstream],
) -> None:
    f, upstream = sse_front
    sse(f).close()
    assert upstream.gone.acquire(timeout=5), "the upstream stream outlived its client"


def test_drain_ends_sse_streams_with_an_error_event(sse_front: tuple[Front, SseUpstream]) -> None:
    f, upstream = sse_front
    sock = sse(f)
    f.begin_drain()
    rest = b""
    while b"0\r\n\r\n" not in rest:  # the last chunk
        rest += sock.recv(65536)
    assert b'data: {"error":"the server is shutting down: stream ended"}' in rest
    assert upstream.gone.acquire(timeout=5)
    assert get(f, "/v2/health/ready")[0] == 503
    sock.close()


def test_end_streams_ends_sse_streams_to_the_model_with_an_error_event(
    sse_front: tuple[Front, SseUpstream],
) -> None:
    f, upstream = sse_front
    sock = sse(f)
    assert f.end_streams(["other"], "other crashed") == 0
    assert f.end_streams(["generate"], "generate crashed and is reloading; retry") == 1
    rest = b""
    while b"0\r\n\r\n" not in rest:
        rest += sock.recv(65536)
    assert b'"error":"generate crashed and is reloading; retry: stream ended"' in rest
    assert upstream.gone.acquire(timeout=5)
    assert get(f, "/v2/health/ready")[0] == 200  # not draining
    sock.close()


def test_port_0_binds_free_ports_and_reports_them(tmp_path: Path) -> None:
    """The port race (#19): helpers picked free ports and released them before the launcher
    bound them ("address already in use" once). Port 0: the front binds any free port itself,
    holds it, and reports the bound one; ``ServerSettings.ephemeral`` asks for it."""
    from tritonforge.runtime.settings import ServerSettings

    assert ServerSettings.ephemeral(tmp_path).http_port == 0
    assert ServerSettings.ephemeral(tmp_path, front=False).http_port != 0  # Triton binds them
    f = Front(
        "127.0.0.1", 0, 0,
        http_socket=lambda: tmp_path / "absent.sock",
        grpc_target=lambda: f"unix:{tmp_path}/absent.sock",
        admin_key=None, admin_header="x-admin", grpc_admin_headers=("x-admin",),
    ).start()  # fmt: skip
    try:
        assert f.http_port and f.grpc_port and f.http_port != f.grpc_port
        for port in (f.http_port, f.grpc_port):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        assert get(f, "/v2/health/ready")[0] == 503  # the front answers: Triton is not there
    finally:
        f.stop()
