"""The gRPC front's stream handling against a stand-in upstream (a plain grpc server on a Unix
socket that streams forever and records cancellation): the integration tests run the same
promises against the real Triton. Issue #19 findings 2b (bound), 4 (cancel), 5 (drain)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
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


def request() -> bytes:
    return service_pb2.ModelInferRequest(model_name="generate").SerializeToString()


def open_stream(f: Front) -> tuple[grpc.Channel, Any]:
    channel = grpc.insecure_channel(f"127.0.0.1:{f.grpc_port}")
    call = channel.stream_stream(STREAM)(iter([request()]), timeout=30)
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
