"""The front's admission of short inferences at their model's queue capacity (core#466): the bounds
computed from served configs, the counting, and the relays against stand-in upstreams (an aiohttp
server on Triton's HTTP socket serving configs and inferences that wait until released, a grpc
server answering ModelInfer the same way); the integration proof is the burst test in
tests/integration/test_reliability_hardening.py."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp import web
from tritonclient.grpc import service_pb2

from tritonforge.runtime.errors import OpenAIError
from tritonforge.runtime.front.app import Front
from tritonforge.runtime.front.grpc import GRPC_INFER
from tritonforge.runtime.front.queues import (
    ModelQueues,
    QueueAdmission,
    QueueBound,
    QueueFullError,
    default_queue,
    ensemble_steps,
    queue_bounds,
)
from tritonforge.runtime.front.settings import FrontLimits, OpenAISettings
from tritonforge.runtime.launcher.settings import free_port


def batched(
    name: str,
    max_queue_size: int | str = 0,
    levels: int = 0,
    per_level: dict[str, int] | None = None,
    default: int = 0,
) -> dict[str, Any]:
    """A model config as Triton's JSON writes it, with a dynamic batcher."""
    batching: dict[str, Any] = {
        "default_queue_policy": {"max_queue_size": max_queue_size, "timeout_action": "REJECT"}
    }
    if levels:  # uint64: strings in Triton's JSON
        batching["priority_levels"] = str(levels)
        batching["default_priority_level"] = str(default)
    if per_level is not None:
        batching["priority_queue_policy"] = {k: {"max_queue_size": v} for k, v in per_level.items()}
    return {"name": name, "dynamic_batching": batching, "instance_group": [{"count": 2}]}


def ensemble(name: str, *steps: str) -> dict[str, Any]:
    return {
        "name": name,
        "platform": "ensemble",
        "ensemble_scheduling": {"step": [{"model_name": s, "model_version": -1} for s in steps]},
    }


# -- the bound, from config dicts ------------------------------------------------------------


def test_a_plain_model_is_counted_in_its_max_queue_size_never_refused() -> None:
    assert default_queue(batched("m", 64)) == (0, 64)
    assert default_queue(batched("m", "64")) == (0, 64)  # read as Triton's JSON may write it
    assert queue_bounds("m", {"m": batched("m", 64)}) == ModelQueues((QueueBound("m", 0, 64),))
    queues = QueueAdmission()
    queues.bounds["m"] = queue_bounds("m", {"m": batched("m", 1)})
    held = [queues.enter("m") for _ in range(3)]  # Triton answers its own refusal of it
    assert queues.held == {("m", 0): 3} and not queues.refused
    for bounds in held:
        queues.leave(bounds)
    assert queues.held == {("m", 0): 0}


def test_no_dynamic_batcher_or_an_unbounded_queue_gives_no_bound() -> None:
    assert default_queue({"name": "m", "instance_group": [{"count": 1}]}) is None
    assert default_queue(batched("m", 0)) is None
    assert queue_bounds("m", {"m": batched("m", 0)}) == ModelQueues()
    assert queue_bounds("absent", {}) == ModelQueues()


def test_priority_levels_give_the_default_levels_queue() -> None:
    # a step request lands on the default level: its own policy, or the default policy
    assert default_queue(batched("m", 64, levels=2, default=2)) == (2, 64)
    assert default_queue(batched("m", 64, levels=2, default=2, per_level={"2": 8})) == (2, 8)
    assert default_queue(batched("m", 64, levels=2, default=2, per_level={"1": 8})) == (2, 64)
    assert default_queue(batched("m", 64, levels=2, default=1, per_level={"1": 0})) is None
    # without priority levels only the default policy counts
    assert default_queue(batched("m", 64, per_level={"1": 8})) == (0, 64)
    bound = QueueBound("fused", 2, 64)
    assert bound.source() == "fused max_queue_size 64 at priority level 2"


def test_an_ensemble_takes_each_bounded_step_and_skips_the_rest() -> None:
    configs = {
        "embed": ensemble("embed", "tokenizer", "encoder", "tokenizer", "post"),
        "tokenizer": batched("tokenizer", 128),
        "encoder": batched("encoder", 64, levels=2, default=2),
        "post": {"name": "post"},  # no dynamic batcher
    }
    assert ensemble_steps(configs["embed"]) == ["tokenizer", "encoder", "post"]
    both = (QueueBound("tokenizer", 0, 128), QueueBound("encoder", 2, 64))
    assert queue_bounds("embed", configs) == ModelQueues(both, refuse=True)
    # an ensemble of ensembles, a step whose config is missing, a decoupled model
    configs["outer"] = ensemble("outer", "embed", "missing")
    assert queue_bounds("outer", configs) == queue_bounds("embed", configs)
    decoupled = {**batched("gen", 8), "model_transaction_policy": {"decoupled": True}}
    assert queue_bounds("gen", {"gen": decoupled}) == ModelQueues()


def test_a_full_step_queue_refuses_the_ensemble_naming_it_and_the_bounds_source() -> None:
    queues = QueueAdmission()
    configs = {"embed": ensemble("embed", "fused"), "fused": batched("fused", 2)}
    queues.bounds = {m: queue_bounds(m, configs) for m in configs}
    held = [queues.enter("embed"), queues.enter("fused")]  # both go to fused's queue
    with pytest.raises(QueueFullError) as full:
        queues.enter("embed")
    assert full.value.status == 503
    message = str(full.value)
    assert message.startswith("embed: overloaded: queue full")
    assert "admits 2 requests at once to fused (fused max_queue_size 2;" in message
    assert "model_queue_admission" in message
    assert queues.refused == {"embed": 1}
    queues.leave(held.pop())
    queues.enter("embed")
    assert queues.enter("unbounded") == ()  # no bound read: let through
    text = "\n".join(queues.metrics(str))
    assert 'tritonforge_front_queue_bound{queue="fused",level="0"} 2' in text
    assert 'tritonforge_front_queue_held{queue="fused",level="0"} 2' in text
    assert 'tritonforge_front_queue_refused_total{model="embed"} 1' in text
    assert 'refused_total{model="fused"}' not in text  # a plain model is never refused


# -- the relays, against stand-in upstreams ---------------------------------------------------

CONFIGS = {"ens": ensemble("ens", "step"), "step": batched("step", 2), "free": {"name": "free"}}
HELD = ("ens", "step")  # the stand-ins answer these once released, "free" at once


@dataclass
class Upstreams:
    """Triton's HTTP and gRPC sockets: configs of :data:`CONFIGS`; an inference of :data:`HELD`
    waits until ``release`` is set. ``arrived``: inferences that reached tritonserver, ``config_reads``."""

    release: threading.Event = field(default_factory=threading.Event)
    arrived: int = 0
    config_reads: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, what: str) -> None:
        with self.lock:
            setattr(self, what, getattr(self, what) + 1)

    async def http_infer(self, request: web.Request) -> web.Response:
        self.count("arrived")
        while request.match_info["model"] in HELD and not self.release.is_set():
            await asyncio.sleep(0.01)
        return web.json_response({"model_name": request.match_info["model"], "outputs": []})

    async def http_config(self, request: web.Request) -> web.Response:
        self.count("config_reads")
        await asyncio.sleep(0.05)  # concurrent first requests must share one read
        name = request.match_info["model"]
        if name not in CONFIGS:
            return web.json_response({"error": f"unknown model: '{name}'"}, status=400)
        return web.json_response(CONFIGS[name])

    def grpc_infer(self, request: bytes, context: Any) -> bytes:
        self.count("arrived")
        self.release.wait(30)
        name = service_pb2.ModelInferRequest.FromString(request).model_name
        return service_pb2.ModelInferResponse(model_name=name).SerializeToString()


def _serve_http(upstreams: Upstreams, path: Path) -> tuple[asyncio.AbstractEventLoop, Any]:
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def start() -> web.AppRunner:
        app = web.Application()
        app.router.add_post("/v2/models/{model}/infer", upstreams.http_infer)
        app.router.add_post("/v2/models/{model}/versions/{v}/infer", upstreams.http_infer)
        app.router.add_get("/v2/models/{model}/config", upstreams.http_config)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.UnixSite(runner, str(path)).start()
        return runner

    return loop, asyncio.run_coroutine_threadsafe(start(), loop).result(10)


def _front(tmp_path: Path, enabled: bool) -> Iterator[tuple[Front, Upstreams]]:
    upstreams = Upstreams()
    loop, runner = _serve_http(upstreams, tmp_path / "http.sock")
    handler = grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService",
        {"ModelInfer": grpc.unary_unary_rpc_method_handler(upstreams.grpc_infer)},
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), handlers=[handler])
    target = f"unix:{tmp_path}/grpc.sock"
    server.add_insecure_port(target)
    server.start()
    f = Front(
        "127.0.0.1",
        free_port(),
        free_port(),
        http_socket=lambda: tmp_path / "http.sock",
        grpc_target=lambda: target,
        admin_key=None,
        admin_header="x-admin",
        grpc_admin_headers=("x-admin",),
        limits=FrontLimits(model_queue_admission=enabled),
        openai=OpenAISettings(tmp_path / "repo"),
    ).start()
    try:
        yield f, upstreams
    finally:
        upstreams.release.set()
        f.stop()
        server.stop(grace=None)
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)


@pytest.fixture
def front(tmp_path: Path) -> Iterator[tuple[Front, Upstreams]]:
    yield from _front(tmp_path, enabled=True)


@pytest.fixture
def front_off(tmp_path: Path) -> Iterator[tuple[Front, Upstreams]]:
    yield from _front(tmp_path, enabled=False)


def http_infer(f: Front, model: str, path: str = "") -> tuple[int, str, str | None]:
    url = f"http://127.0.0.1:{f.http_port}/v2/models/{model}{path}/infer"
    body = json.dumps({"inputs": []}).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=30) as r:
            return r.status, r.read().decode(), r.headers.get("Retry-After")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), e.headers.get("Retry-After")


def in_background(call: Any, *args: Any) -> list[Any]:
    """Run ``call(*args)`` in a thread; its result lands in the returned list."""
    out: list[Any] = []
    threading.Thread(target=lambda: out.append(call(*args)), daemon=True).start()
    return out


def wait_for(condition: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_http_infers_past_the_step_queue_get_503_at_once_and_never_reach_triton(
    front: tuple[Front, Upstreams],
) -> None:
    f, up = front
    # the ensemble and its step called directly share the step's queue
    waiting = [in_background(http_infer, f, "ens"), in_background(http_infer, f, "step")]
    wait_for(lambda: up.arrived == 2)
    # answered while the two held ones still wait upstream: refused on arrival
    status, body, retry_after = http_infer(f, "ens", "/versions/1")
    assert status == 503 and retry_after is not None
    assert "ens: overloaded: queue full" in body and "step max_queue_size 2" in body
    assert up.arrived == 2
    # the plain model is never refused by the front (Triton answers its own refusal)
    waiting.append(in_background(http_infer, f, "step"))
    wait_for(lambda: up.arrived == 3)
    assert http_infer(f, "free")[0] == 200  # a model without a bounded queue is not held
    assert 'tritonforge_front_queue_refused_total{model="ens"} 1' in f.metrics()
    up.release.set()
    wait_for(lambda: all(waiting))
    assert [w[0][0] for w in waiting] == [200, 200, 200]
    assert http_infer(f, "ens")[0] == 200  # the slots were given back
    assert up.config_reads == 4  # ens, its step, step itself, free: once each


def test_grpc_model_infer_past_the_step_queue_is_unavailable_naming_it(
    front: tuple[Front, Upstreams],
) -> None:
    f, up = front
    channel = grpc.insecure_channel(f"127.0.0.1:{f.grpc_port}")
    infer = channel.unary_unary(GRPC_INFER)

    def call(model: str) -> tuple[grpc.StatusCode, str]:
        request = service_pb2.ModelInferRequest(model_name=model).SerializeToString()
        try:
            infer(request, timeout=30)
            return grpc.StatusCode.OK, ""
        except grpc.RpcError as e:
            return e.code(), e.details() or ""

    waiting = [in_background(call, "ens") for _ in range(2)]
    wait_for(lambda: up.arrived == 2)
    code, details = call("ens")
    assert code == grpc.StatusCode.UNAVAILABLE
    assert "ens: overloaded: queue full" in details and "step max_queue_size 2" in details
    assert up.arrived == 2
    up.release.set()
    wait_for(lambda: all(waiting))
    assert [w[0][0] for w in waiting] == [grpc.StatusCode.OK] * 2
    assert call("ens")[0] == grpc.StatusCode.OK
    assert up.config_reads == 2  # ens and its step, once, for concurrent first calls
    channel.close()


def test_v1_inferences_hold_the_same_slots_and_are_refused_as_overloaded(
    front: tuple[Front, Upstreams],
) -> None:
    """``OpenAIFront.infer`` (what ``/v1/embeddings`` and the task routes such as ``/rerank``
    call) takes the v2 slots: past the step's bound an :class:`OpenAIError` 503, ``overloaded``."""
    f, up = front
    openai = f.http.openai
    assert openai is not None

    def v1_infer() -> Any:
        call = openai.infer("ens", {"inputs": []})
        return asyncio.run_coroutine_threadsafe(call, f._loop).result(30)

    waiting = [in_background(http_infer, f, "ens"), in_background(v1_infer)]
    wait_for(lambda: up.arrived == 2)
    with pytest.raises(OpenAIError) as refused:
        v1_infer()
    assert refused.value.status == 503 and refused.value.code == "overloaded"
    assert "ens: overloaded: queue full" in str(refused.value)
    assert up.arrived == 2
    up.release.set()
    wait_for(lambda: all(waiting))
    assert waiting[0][0][0] == 200 and waiting[1][0][0]  # the v1 one got its body
    assert v1_infer()[0]


def test_switched_off_every_infer_reaches_triton(front_off: tuple[Front, Upstreams]) -> None:
    f, up = front_off
    waiting = [in_background(http_infer, f, "ens") for _ in range(3)]
    wait_for(lambda: up.arrived == 3)
    up.release.set()
    wait_for(lambda: len([w for w in waiting if w]) == 3)
    assert [w[0][0] for w in waiting] == [200] * 3
    assert up.config_reads == 0


def test_the_sidecar_switch_reads_true_or_false() -> None:
    import argparse

    from tritonforge.runtime.front.app import add_limits_arguments

    parser = argparse.ArgumentParser()
    add_limits_arguments(parser)
    assert parser.parse_args([]).model_queue_admission is True
    assert parser.parse_args(["--model-queue-admission", "false"]).model_queue_admission is False
    assert parser.parse_args(["--max-open-streams", "3"]).max_open_streams == 3
    with pytest.raises(SystemExit):
        parser.parse_args(["--model-queue-admission", "no"])


def test_an_unknown_model_is_asked_for_once_per_interval_not_per_request(
    front: tuple[Front, Upstreams],
) -> None:
    f, up = front
    reader = f.http.queue_capacity.reader
    now = [100.0]
    reader.clock = lambda: now[0]
    for _ in range(5):  # the stand-in answers any inference; tritonserver would say 400
        assert http_infer(f, "nope")[0] == 200
    assert up.config_reads == 1
    now[0] += reader.unreadable_retry_s  # e.g. a pipeline loaded meanwhile: asked again
    assert http_infer(f, "nope")[0] == 200
    assert up.config_reads == 2
    for _ in range(3):  # a known model: read once, as before
        assert http_infer(f, "free")[0] == 200
    assert up.config_reads == 3
