"""The gRPC front's stream handling against a stand-in upstream (a plain grpc server on a Unix
socket that streams forever and records cancellation): the integration tests run the same
promises against the real Triton; the SSE ones use a stand-in aiohttp upstream. Issue #19
findings 2b (bound, separate pools), 4 (cancel, disconnect), 5 (drain)."""

from __future__ import annotations

import asyncio
import json
import queue
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
import numpy as np
import pytest
from aiohttp import web
from tritonclient.grpc import service_pb2

from tritonforge.runtime.front.app import Front
from tritonforge.runtime.front.grpc import GRPC_INFER, GRPC_SERVICE
from tritonforge.runtime.front.settings import FrontLimits
from tritonforge.runtime.launcher.settings import free_port

STREAM = f"{GRPC_SERVICE}ModelStreamInfer"
ANSWERED = "answered"  # the stand-in answers this model once, finally, and waits for the end


# The model metadata the stand-in answers: what Triton's generate mapping reads.
INPUTS = {"text_input": ("BYTES", [1]), "max_tokens": ("INT32", [1]), "temperature": ("FP32", [1])}


def text_response(model: str, text: str, final: bool = False) -> bytes:
    """A streamed response as Triton sends it: ``text_output`` (BYTES, one element)."""
    response = service_pb2.ModelStreamInferResponse()
    infer = response.infer_response
    if final:
        infer.parameters["triton_final_response"].bool_param = True
    infer.model_name, infer.model_version = model, "1"
    out = infer.outputs.add()
    out.name, out.datatype = "text_output", "BYTES"
    out.shape.append(1)
    raw = text.encode()
    infer.raw_output_contents.append(len(raw).to_bytes(4, "little") + raw)
    return response.SerializeToString()


class Upstream(grpc.GenericRpcHandler):
    """Streams a ``text_output`` response every 20 ms until cancelled (the requests it got are
    recorded); ModelMetadata answers :data:`INPUTS`; ModelInfer answers NOT_FOUND."""

    def __init__(self) -> None:
        self.cancelled = threading.Semaphore(0)
        self.ends: queue.Queue[str] = queue.Queue()
        self.open = 0
        self.requests: list[service_pb2.ModelInferRequest] = []

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if details.method == STREAM:
            return grpc.stream_stream_rpc_method_handler(self._stream)
        if details.method == GRPC_INFER:
            return grpc.unary_unary_rpc_method_handler(self._infer)
        if details.method == f"{GRPC_SERVICE}ModelMetadata":
            return grpc.unary_unary_rpc_method_handler(self._metadata)
        return None

    def _metadata(self, request: bytes, context: Any) -> bytes:
        name = service_pb2.ModelMetadataRequest.FromString(request).name
        answer = service_pb2.ModelMetadataResponse(name=name, versions=["1"])
        for input_name, (datatype, shape) in INPUTS.items():
            answer.inputs.add(name=input_name, datatype=datatype, shape=shape)
        return answer.SerializeToString()

    def _stream(self, requests: Iterator[bytes], context: Any) -> Iterator[bytes]:
        request = service_pb2.ModelInferRequest.FromString(next(requests))
        self.requests.append(request)
        context.add_callback(self.cancelled.release)
        if request.model_name == ANSWERED:
            yield from self._answer(request, requests, context)
            return
        self.open += 1
        response = text_response(request.model_name, "x")
        try:
            while context.is_active():
                yield response
                time.sleep(0.02)
        finally:
            self.open -= 1

    def _answer(
        self, request: service_pb2.ModelInferRequest, requests: Iterator[bytes], context: Any
    ) -> Iterator[bytes]:
        """One final response, then wait for the client's end: ``ends`` gets "half-closed"
        when its request stream ended and no cancel followed within 0.5 s, else "cancelled"."""
        yield text_response(request.model_name, "x", final=True)
        try:
            for _ in requests:
                pass
        except Exception:
            pass
        deadline = time.monotonic() + 0.5
        while context.is_active() and time.monotonic() < deadline:
            time.sleep(0.01)
        self.ends.put("half-closed" if context.is_active() else "cancelled")

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


def test_a_client_that_cancels_after_its_final_response_gets_its_call_closed_not_cancelled(
    front: tuple[Front, Upstream],
) -> None:
    """Triton 2.51 leaks a stream whose cancel races its final response (runtime/stream_end):
    a client that cancels once every request was answered must not pass the cancel on."""
    f, upstream = front
    channel = grpc.insecure_channel(f"127.0.0.1:{f.grpc_port}")
    requests: queue.Queue[bytes | None] = queue.Queue()
    requests.put(request(ANSWERED))
    call = channel.stream_stream(STREAM)(iter(requests.get, None), timeout=30)
    final = service_pb2.ModelStreamInferResponse.FromString(next(call))
    assert final.infer_response.parameters["triton_final_response"].bool_param
    call.cancel()  # tritonclient's stop_stream(cancel_requests=True) after its answer
    assert upstream.ends.get(timeout=5) == "half-closed"
    requests.put(None)
    channel.close()


def test_a_client_that_cancels_before_its_final_response_cancels_upstream(
    front: tuple[Front, Upstream],
) -> None:
    f, upstream = front
    channel = grpc.insecure_channel(f"127.0.0.1:{f.grpc_port}")
    requests: queue.Queue[bytes | None] = queue.Queue()
    requests.put(request(ANSWERED))
    requests.put(request("generate"))  # a second request on the stream, still unanswered
    call = channel.stream_stream(STREAM)(iter(requests.get, None), timeout=30)
    next(call)
    call.cancel()
    assert upstream.ends.get(timeout=5) == "cancelled"
    requests.put(None)
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


class HttpUpstream:
    """Triton's HTTP socket as the front uses it: ``/v2/health/ready``, the configs (the stream
    bounds: ``generate`` admits ``max_running + max_queue`` = 1 by its config), and a
    ``generate_stream`` that counts its calls: the front must never stream over HTTP."""

    def __init__(self, path: Path) -> None:
        self.path, self.http_streams, self.generates = path, 0, 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> None:
        index = [{"name": m, "version": "1", "state": "READY"} for m in CONFIGS]
        app = web.Application()
        app.router.add_post("/v2/models/{model}/generate_stream", self._stream)
        app.router.add_post("/v2/models/{model}/generate", self._generate)
        app.router.add_get("/v2/health/ready", lambda _: web.Response(text=""))
        app.router.add_post("/v2/repository/index", lambda _: web.json_response(index))
        app.router.add_get(
            "/v2/models/{model}/config",
            lambda r: web.json_response(CONFIGS[r.match_info["model"]]),
        )
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.UnixSite(self.runner, str(self.path)).start()

    async def _stream(self, request: web.Request) -> web.Response:
        self.http_streams += 1
        return web.Response(status=500, text="streamed over HTTP")

    async def _generate(self, request: web.Request) -> web.Response:
        """A non-streamed generate whose model never answers (a crashed stub)."""
        self.generates += 1
        while request.transport is not None and not request.transport.is_closing():
            await asyncio.sleep(0.05)
        return web.Response(status=500)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


def _decoupled(name: str, **parameters: int) -> dict[str, Any]:
    return {
        "name": name,
        "model_transaction_policy": {"decoupled": True},
        "parameters": {k: {"string_value": str(v)} for k, v in parameters.items()},
    }


CONFIGS = {
    "generate": _decoupled("generate", max_running=1, max_queue=0),
    "generate_int8": _decoupled("generate_int8"),  # declares no capacity: max_open_streams
    ANSWERED: _decoupled(ANSWERED),
}


@pytest.fixture
def sse_front(tmp_path: Path) -> Iterator[tuple[Front, Upstream, HttpUpstream]]:
    upstream = Upstream()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), handlers=[upstream])
    target = f"unix:{tmp_path}/grpc.sock"
    server.add_insecure_port(target)
    server.start()
    http = HttpUpstream(tmp_path / "http.sock")
    f = Front(
        "127.0.0.1",
        free_port(),
        free_port(),
        http_socket=lambda: http.path,
        grpc_target=lambda: target,
        admin_key=None,
        admin_header="x-admin",
        grpc_admin_headers=("x-admin",),
        limits=FrontLimits(max_open_streams=2, max_upstream_connections=1),
    ).start()
    try:
        yield f, upstream, http
    finally:
        f.stop()
        http.stop()
        server.stop(grace=None)


def sse(f: Front, model: str = "generate_int8", body: bytes = b"{}") -> socket.socket:
    """An SSE ``generate_stream`` request whose first event arrived."""
    sock = socket.create_connection(("127.0.0.1", f.http_port), timeout=30)
    sock.sendall(
        b"POST /v2/models/%s/generate_stream HTTP/1.1\r\nHost: x\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (model.encode(), len(body), body)
    )
    seen = b""
    while b"data:" not in seen:
        chunk = sock.recv(4096)
        assert chunk, seen
        seen += chunk
    return sock


def get(f: Front, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{f.http_port}{path}", timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def refused_sse(f: Front, model: str) -> tuple[int, str]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{f.http_port}/v2/models/{model}/generate_stream", data=b"{}"
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    return refused.value.code, refused.value.read().decode()


def wait_for(condition: Any, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_sse_streams_are_bounded_and_leave_short_requests_their_pool(
    sse_front: tuple[Front, Upstream, HttpUpstream],
) -> None:
    f, _, http = sse_front
    socks = [sse(f), sse(f)]  # more streams than short-request connections (1)
    assert get(f, "/v2/health/ready")[0] == 200
    status, body = refused_sse(f, "generate_int8")
    assert status == 503 and "max_open_streams=2" in body and "generate_int8" in body
    assert http.http_streams == 0  # the SSE streams went over gRPC, not Triton's HTTP
    for sock in socks:
        sock.close()


def test_sse_is_served_over_grpc_in_tritons_wire_format(
    sse_front: tuple[Front, Upstream, HttpUpstream],
) -> None:
    """The front maps the JSON request like Triton's generate endpoint (keys that are inputs
    become tensors, also inside ``parameters``; the others request parameters) and writes each
    response as Triton's SSE event; Triton's HTTP socket never sees the stream."""
    f, upstream, http = sse_front
    body = json.dumps(
        {"text_input": "hé", "parameters": {"max_tokens": 3, "temperature": 0.5, "seed_x": "s"}}
    ).encode()
    sock = sse(f, "generate_int8", body)
    head = sock.recv(65536)
    while head.count(b"data: ") < 2:
        head += sock.recv(65536)
    sock.close()
    assert http.http_streams == 0
    [request] = upstream.requests
    assert request.model_name == "generate_int8"
    tensors = {t.name: (t.datatype, list(t.shape)) for t in request.inputs}
    assert tensors == {
        "text_input": ("BYTES", [1]),
        "max_tokens": ("INT32", [1]),
        "temperature": ("FP32", [1]),
    }
    raw = dict(zip([t.name for t in request.inputs], request.raw_input_contents, strict=True))
    assert raw["text_input"] == b"\x03\x00\x00\x00h\xc3\xa9"
    assert raw["max_tokens"] == (3).to_bytes(4, "little")
    assert raw["temperature"] == np.float32(0.5).tobytes()
    assert request.parameters["seed_x"].string_param == "s"
    assert request.parameters["triton_enable_empty_final_response"].bool_param
    event = b'data: {"model_name":"generate_int8","model_version":"1","text_output":"x"}\n\n'
    assert event in head


def test_an_sse_stream_answered_in_full_closes_its_call_without_a_cancel(
    sse_front: tuple[Front, Upstream, HttpUpstream],
) -> None:
    f, upstream, _ = sse_front
    sock = sse(f, ANSWERED)
    sock.close()
    assert upstream.ends.get(timeout=5) == "half-closed"


def test_a_bad_generate_request_is_a_400_naming_the_key(
    sse_front: tuple[Front, Upstream, HttpUpstream],
) -> None:
    f, upstream, _ = sse_front
    for body, named in (
        (b'{"text_input": 5}', "text_input"),
        (b'{"text_input": "x", "parameters": {"top_p": [0.5]}}', "top_p"),
        (b'{"text_input": "x", "parameters": 3}', "parameters"),
    ):
        request = urllib.request.Request(
            f"http://127.0.0.1:{f.http_port}/v2/models/generate/generate_stream", data=body
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=30)
        assert err.value.code == 400
        assert named in json.loads(err.value.read())["error"]
    assert not upstream.requests
    assert f.admission.open_streams == 0


def test_each_streaming_model_has_its_own_bound_from_its_config(
    sse_front: tuple[Front, Upstream, HttpUpstream],
) -> None:
    """A flood of ``generate_int8`` streams cannot refuse ``generate``: each model holds its own
    slots, ``min(max_open_streams, max_running + max_queue of its config)``; the 503 names the
    model and its bound."""
    f, _, _ = sse_front
    floods = [sse(f, "generate_int8"), sse(f, "generate_int8")]
    status, body = refused_sse(f, "generate_int8")
    assert status == 503 and "generate_int8: overloaded: 2 streams open, its bound is 2" in body
    generate = sse(f, "generate")  # still accepted
    status, body = refused_sse(f, "generate")
    assert status == 503 and "generate: overloaded: 1 streams open, its bound is 1" in body
    assert "its config admits 1: max_running + max_queue" in body
    metrics = f.metrics()
    assert 'tritonforge_front_open_streams{model="generate"} 1' in metrics
    assert 'tritonforge_front_open_streams{model="generate_int8"} 2' in metrics
    assert 'tritonforge_front_stream_bound{model="generate"} 1' in metrics
    with grpc.insecure_channel(f"127.0.0.1:{f.grpc_port}") as channel:  # gRPC: the same bound
        call = channel.stream_stream(STREAM)(iter([request("generate")]), timeout=30)
        with pytest.raises(grpc.RpcError) as err:
            next(call)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "generate: overloaded: 1 streams open, its bound is 1" in (err.value.details() or "")
    for sock in (*floods, generate):
        sock.close()
    assert wait_for(lambda: f.admission.open_streams == 0)


def test_an_sse_client_that_leaves_cancels_the_upstream_call_and_frees_its_slot(
    sse_front: tuple[Front, Upstream, HttpUpstream],
) -> None:
    f, upstream, _ = sse_front
    sock = sse(f, "generate")
    assert 'tritonforge_front_open_streams{model="generate"} 1' in f.metrics()
    sock.close()
    assert upstream.cancelled.acquire(timeout=5), "the upstream call outlived its client"
    assert wait_for(lambda: f.admission.open_streams == 0)
    assert 'tritonforge_front_open_streams{model="generate"} 0' in f.metrics()


def test_drain_ends_sse_streams_with_an_error_event(
    sse_front: tuple[Front, Upstream, HttpUpstream],
) -> None:
    f, upstream, _ = sse_front
    sock = sse(f)
    f.begin_drain()
    rest = b""
    while b"0\r\n\r\n" not in rest:  # the last chunk
        rest += sock.recv(65536)
    assert b'data: {"error":"the server is shutting down: stream ended"}' in rest
    assert upstream.cancelled.acquire(timeout=5)
    assert get(f, "/v2/health/ready")[0] == 503
    sock.close()


def test_end_streams_ends_sse_streams_to_the_model_with_an_error_event(
    sse_front: tuple[Front, Upstream, HttpUpstream],
) -> None:
    f, upstream, _ = sse_front
    sock = sse(f, "generate")
    assert f.end_streams(["other"], "other crashed") == 0
    assert f.end_streams(["generate"], "generate crashed and is reloading; retry") == 1
    rest = b""
    while b"0\r\n\r\n" not in rest:
        rest += sock.recv(65536)
    assert b'"error":"generate crashed and is reloading; retry: stream ended"' in rest
    assert upstream.cancelled.acquire(timeout=5)
    assert get(f, "/v2/health/ready")[0] == 200  # not draining
    sock.close()


def test_port_0_binds_free_ports_and_reports_them(tmp_path: Path) -> None:
    """The port race (#19): helpers picked free ports and released them before the launcher
    bound them ("address already in use" once). Port 0: the front binds any free port itself,
    holds it, and reports the bound one; ``ServerSettings.ephemeral`` asks for it."""
    from tritonforge.runtime.launcher.settings import ServerSettings

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


def test_end_streams_ends_a_non_streamed_generate_with_a_503(
    sse_front: tuple[Front, Upstream, HttpUpstream],
) -> None:
    """A v2 ``generate`` (non-streamed) to a model whose stub crashed waited
    ``request_timeout_s`` for an answer that never came; the supervisor's ``end_streams`` ends
    it with a 503 saying why."""
    f, _, http = sse_front
    answer: list[tuple[int, str]] = []

    def generate() -> None:
        request = urllib.request.Request(
            f"http://127.0.0.1:{f.http_port}/v2/models/generate/generate", data=b"{}"
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                answer.append((r.status, r.read().decode()))
        except urllib.error.HTTPError as e:
            answer.append((e.code, e.read().decode()))

    thread = threading.Thread(target=generate)
    thread.start()
    assert wait_for(lambda: http.generates == 1)
    assert f.end_streams(["other"], "other crashed") == 0
    assert f.end_streams(["generate"], "generate crashed and is reloading; retry") == 1
    thread.join(timeout=10)
    [(status, body)] = answer
    assert status == 503
    assert json.loads(body)["error"] == "generate crashed and is reloading; retry: request ended"
    assert f.wait_idle(timeout_s=5)
