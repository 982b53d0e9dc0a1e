"""``/v1`` streamed completions hold a slot among the front's open streams, like the v2 SSE and
gRPC streams (issue #19): past ``max_open_streams`` they get a 503 in OpenAI's error shape, and
the supervisor's ``end_streams`` (a crashed stub) or a drain ends them with a last error event
saying why. A real front on free loopback ports; stand-in upstreams: an aiohttp server on a Unix
socket answering the catalog (repository index, model config), and a gRPC server whose
``ModelStreamInfer`` sends a text chunk every 20 ms until cancelled (recorded)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp import web
from tokenizers import Tokenizer, models
from tritonclient.grpc import service_pb2

from tests.unit.test_openai_api import GENERATE
from tritonforge.generation import TEXT_OUTPUT
from tritonforge.runtime.front.app import Front
from tritonforge.runtime.front.grpc import GRPC_SERVICE
from tritonforge.runtime.front.openai.upstream import bytes_tensor
from tritonforge.runtime.front.settings import FrontLimits, OpenAISettings
from tritonforge.runtime.launcher.settings import free_port

STREAM = f"{GRPC_SERVICE}ModelStreamInfer"
CRASHED = "generate is unavailable: its stub crashed and is reloading; retry"


# The generate model's config as the /v1 catalog reads it, with its generation metadata file.
CONFIG = {
    **GENERATE,
    "parameters": {
        **GENERATE["parameters"],
        "generation_file": {"string_value": "generation.json"},
    },
}


class Generator(grpc.GenericRpcHandler):
    """``ModelStreamInfer``: a text chunk every 20 ms, never a final one, until cancelled."""

    def __init__(self) -> None:
        self.cancelled = threading.Semaphore(0)
        self.started = threading.Semaphore(0)
        chunk = service_pb2.ModelStreamInferResponse()
        out = chunk.infer_response.outputs.add()
        out.name, out.datatype = TEXT_OUTPUT, "BYTES"
        chunk.infer_response.raw_output_contents.append(bytes_tensor(["x"]))
        self.chunk = chunk.SerializeToString()

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if details.method == STREAM:
            return grpc.stream_stream_rpc_method_handler(self._stream)
        return None

    def _stream(self, requests: Iterator[bytes], context: Any) -> Iterator[bytes]:
        next(requests)
        context.add_callback(self.cancelled.release)
        self.started.release()
        while context.is_active():
            yield self.chunk
            time.sleep(0.02)


class Catalog:
    """Triton's HTTP socket as far as the ``/v1`` catalog reads it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> None:
        index = [{"name": "generate", "version": "1", "state": "READY"}]
        app = web.Application()
        app.router.add_post("/v2/repository/index", lambda _: web.json_response(index))
        app.router.add_get("/v2/models/generate/config", lambda _: web.json_response(CONFIG))
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.UnixSite(self.runner, str(self.path)).start()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture
def front(tmp_path: Path) -> Iterator[tuple[Front, Generator]]:
    version = tmp_path / "repo" / "generate" / "1"
    version.mkdir(parents=True)
    vocab = {"[UNK]": 0, "a": 1, "x": 2}
    Tokenizer(models.WordLevel(vocab, unk_token="[UNK]")).save(str(version / "tokenizer.json"))
    (version / "generation.json").write_text(json.dumps({"chat_template": None}))
    generator = Generator()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), handlers=[generator])
    target = f"unix:{tmp_path}/grpc.sock"
    server.add_insecure_port(target)
    server.start()
    catalog = Catalog(tmp_path / "http.sock")
    f = Front(
        "127.0.0.1",
        free_port(),
        free_port(),
        http_socket=lambda: catalog.path,
        grpc_target=lambda: target,
        admin_key=None,
        admin_header="x-admin",
        grpc_admin_headers=("x-admin",),
        limits=FrontLimits(max_open_streams=2),
        openai=OpenAISettings(tmp_path / "repo"),
    ).start()
    try:
        yield f, generator
    finally:
        f.stop()
        catalog.stop()
        server.stop(grace=None)


def completion(f: Front, stream: bool = True) -> socket.socket:
    """A ``/v1/completions`` request, sent; the socket to read its answer from."""
    body = json.dumps({"model": "generate", "prompt": "a", "stream": stream}).encode()
    sock = socket.create_connection(("127.0.0.1", f.http_port), timeout=30)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    return sock


def read_until(sock: socket.socket, marker: bytes, timeout_s: float = 20.0) -> bytes:
    """What ``sock`` received up to ``marker``; fails past ``timeout_s`` (a stream that never
    ends keeps sending)."""
    seen, deadline = b"", time.monotonic() + timeout_s
    while marker not in seen:
        assert time.monotonic() < deadline, f"no {marker!r} within {timeout_s} s: {seen[-300:]!r}"
        chunk = sock.recv(65536)
        assert chunk, f"closed before {marker!r}: {seen[-300:]!r}"
        seen += chunk
    return seen


def streaming(f: Front) -> socket.socket:
    """A streamed completion, once its first text event arrived."""
    sock = completion(f)
    read_until(sock, b'"text":"x"')
    return sock


def error_events(raw: bytes) -> list[dict[str, Any]]:
    events = [line[len(b"data: ") :] for line in raw.split(b"\n") if line.startswith(b"data: {")]
    return [e["error"] for e in map(json.loads, events) if "error" in e]


def test_v1_streams_share_the_fronts_stream_bound_and_are_refused_past_it(
    front: tuple[Front, Generator],
) -> None:
    f, _ = front
    socks = [streaming(f), streaming(f)]
    assert f.admission.open_streams == 2
    refused = read_until(completion(f), b"}}")
    assert refused.startswith(b"HTTP/1.1 503 ")
    error = json.loads(refused.split(b"\r\n\r\n", 1)[1])["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "max_open_streams=2" in error["message"] and error["type"] == "server_error"
    with grpc.insecure_channel(f"127.0.0.1:{f.grpc_port}") as channel:  # v2 shares the bound
        request = service_pb2.ModelInferRequest(model_name="generate").SerializeToString()
        call = channel.stream_stream(STREAM)(iter([request]), timeout=30)
        with pytest.raises(grpc.RpcError) as err:
            next(call)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    for sock in socks:
        sock.close()
    deadline = time.monotonic() + 10
    while f.admission.open_streams and time.monotonic() < deadline:
        time.sleep(0.05)
    assert f.admission.open_streams == 0  # a client that left gives its slot back


def test_end_streams_ends_v1_streams_to_the_model_with_an_error_event(
    front: tuple[Front, Generator],
) -> None:
    """What the supervisor does when a decoupled model's stub died: its streams never end."""
    f, generator = front
    sock = streaming(f)
    assert f.end_streams(["other"], "other crashed") == 0
    assert f.end_streams(["generate"], CRASHED) == 1
    rest = read_until(sock, b"0\r\n\r\n")  # the last chunk: the stream ended
    [error] = error_events(rest)
    assert error["message"] == f"{CRASHED}: stream ended" and error["type"] == "server_error"
    assert b"data: [DONE]" in rest
    assert generator.cancelled.acquire(timeout=5), "the upstream call outlived the stream"
    assert f.wait_idle(timeout_s=5)
    sock.close()


def test_drain_ends_v1_streams_with_an_error_event(front: tuple[Front, Generator]) -> None:
    f, generator = front
    sock = streaming(f)
    f.begin_drain()
    [error] = error_events(read_until(sock, b"0\r\n\r\n"))
    assert error["message"] == "the server is shutting down: stream ended"
    assert generator.cancelled.acquire(timeout=5)
    assert f.wait_idle(timeout_s=5)
    sock.close()


def test_a_v1_request_in_flight_keeps_the_front_busy_for_the_drain(
    front: tuple[Front, Generator],
) -> None:
    """A non-streamed completion holds no stream slot, but it is in flight: a drain's
    ``wait_idle`` waits for it (before, the front looked idle and Triton got SIGTERM under it)."""
    f, generator = front
    sock = completion(f, stream=False)
    deadline = time.monotonic() + 10
    while f.admission.idle() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not f.admission.idle() and f.admission.open_streams == 0
    assert not f.wait_idle(timeout_s=0.3)
    sock.close()  # the client leaves: its request ends, the front is idle again
    assert generator.cancelled.acquire(timeout=10)
    assert f.wait_idle(timeout_s=10)


def test_end_streams_ends_a_non_streamed_v1_request_with_a_503(
    front: tuple[Front, Generator],
) -> None:
    """A non-streamed completion to a model whose stub crashed waited ``request_timeout_s``
    (60 s) for a final response that never came: the supervisor's ``end_streams`` now ends it
    too, with a 503 saying why, and cancels its upstream call."""
    f, generator = front
    sock = completion(f, stream=False)
    assert generator.started.acquire(timeout=20), "the generation never reached the upstream"
    assert f.admission.open_streams == 0  # it holds no stream slot
    assert f.end_streams(["other"], "other crashed") == 0
    assert f.end_streams(["generate"], CRASHED) == 1
    answer = read_until(sock, b"}}")
    assert answer.startswith(b"HTTP/1.1 503 "), answer[:200]
    error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["message"] == f"{CRASHED}: request ended" and error["type"] == "server_error"
    assert generator.cancelled.acquire(timeout=5), "the upstream call outlived the request"
    assert f.wait_idle(timeout_s=5)
    sock.close()
