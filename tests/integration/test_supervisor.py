"""Issue #19, against the real embedded Triton: one sick model or a burst of load never takes
every pipeline down. Each test is one finding (it failed before the fix):

1. a SIGSEGVed shared stub (the tokenizer) is reloaded with every model that calls it; nothing
   else stops answering and the server is not restarted;
2a. a flood past generate's queue marks it not ready (overloaded) and restarts nothing;
3. after whole-server restarts the front's gRPC reaches the new Triton at once, and there is
   no restart loop;
8. the metrics port stays bound while tritonserver restarts.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import PIPELINE_REPOSITORY
from tests.integration.reliability import Load, linked_repository, text_inputs
from tritonforge.generation import TEXT_INPUT
from tritonforge.loadtest.reliability.chaos.outcomes import OK
from tritonforge.loadtest.reliability.chaos.probes import stream_once
from tritonforge.pipelines import from_repository
from tritonforge.repository import load_model_config
from tritonforge.runtime.launcher.settings import ServerSettings
from tritonforge.runtime.serving import EmbeddedServer
from tritonforge.runtime.supervisor.model_graph import public_models
from tritonforge.runtime.supervisor.supervisor import Backoff, Supervisor

pytestmark = pytest.mark.integration

EMBED_MODELS = (
    "tokenizer", "encoder_fp32", "encoder_int8", "encoder_torchscript", "fused_fp32", "fused_int8",
    "embed", "embed_int8", "embed_torchscript", "embed_bls",
)  # fmt: skip


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> float:
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout_s, f"{what}: not within {timeout_s} s"
        time.sleep(0.1)
    return time.monotonic() - start


def _generate_model() -> str:
    """The exported decoupled (streaming) public model, found from the configs."""
    for model in public_models(PIPELINE_REPOSITORY):
        config = load_model_config(PIPELINE_REPOSITORY, model)
        if config.raw.get("model_transaction_policy", {}).get("decoupled"):
            return model
    pytest.skip(reason="no decoupled (generate) model exported: run `make export`")


def _flood_until(
    done: Callable[[], bool], call: Callable[[], tuple[str, str]], clients: int, limit_s: float = 60
) -> list[tuple[str, str]]:
    """Outcomes of ``clients`` clients each repeating ``call`` (0.1 s apart after a refusal)
    until ``done()`` (polled every 0.1 s) holds or ``limit_s`` passes; every call started ends."""
    stop = threading.Event()
    outcomes: list[tuple[str, str]] = []

    def client() -> None:
        while not stop.is_set():
            outcomes.append(call())
            if outcomes[-1][0] != OK:
                time.sleep(0.1)

    with concurrent.futures.ThreadPoolExecutor(max_workers=clients) as pool:
        futures = [pool.submit(client) for _ in range(clients)]
        deadline = time.monotonic() + limit_s
        try:
            while not done() and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            stop.set()
            for future in futures:
                future.result()
    return outcomes


def _pipeline_models(model: str) -> tuple[str, ...]:
    for pipeline in from_repository(PIPELINE_REPOSITORY).values():
        if model in pipeline.public_models:
            return pipeline.models
    return (model,)


def _answers(server: EmbeddedServer, model: str) -> bool:
    try:
        grpcclient.InferenceServerClient(server.grpc_url).infer(
            model, text_inputs(["back?"]), client_timeout=5
        )
        return True
    except Exception:
        return False


def test_finding1_sigsegv_of_the_shared_tokenizer_reloads_its_dependents_not_the_server(
    tmp_path: Path,
) -> None:
    repo = linked_repository(tmp_path / "repo", EMBED_MODELS)
    server = EmbeddedServer(ServerSettings.ephemeral(repo, model_control_mode="explicit"))
    server.start().wait_ready()
    supervisor = Supervisor(server, canary_interval_s=1.0, poll_interval_s=0.2)
    try:
        supervisor.start()
        assert supervisor.health().healthy, supervisor.health()
        pid = server.pid
        victim_loads = [Load(server.grpc_url, m, timeout_s=10.0, workers=1).start() for m in
                        ("embed", "embed_bls")]  # fmt: skip
        victim_loads[0].wait_for(5)
        stub = server.stub_pids()["tokenizer_0_0"]
        killed_at = time.monotonic()
        os.kill(stub, signal.SIGSEGV)
        _wait(lambda: supervisor.health().model_reloads >= 1, 30, "tokenizer reloaded")
        # every public model that calls the tokenizer answers again, without a server restart
        for model in ("embed", "embed_int8", "embed_torchscript", "embed_bls"):
            _wait(lambda m=model: _answers(server, m), 30, f"{model} answering")  # type: ignore[misc]
        back_s = time.monotonic() - killed_at
        _wait(lambda: supervisor.health().healthy, 30, "supervisor healthy")
        for load in victim_loads:
            load.stop()
        health = supervisor.health()
        assert server.pid == pid, health  # never a whole-server restart
        assert health.server_restarts == 0, health
        assert "reloaded tokenizer" in health.last_restart_reason, health
        assert back_s < 30, back_s
        # requests after the recovery all succeed
        for load in victim_loads:
            late = [o for o in load.outcomes if o.started_s > back_s + (killed_at - load.t0)]
            assert not [o for o in late if o.error], late[:3]
    finally:
        supervisor.stop()
        server.stop()


def test_finding1_unrelated_pipeline_has_zero_failures_while_a_stub_is_reloaded(
    tmp_path: Path,
) -> None:
    """The tokenizer of the embedding pipeline dies; the generate pipeline does not notice."""
    generate = _generate_model()
    repo = linked_repository(
        tmp_path / "repo", (*EMBED_MODELS[:2], "fused_fp32", "embed", *_pipeline_models(generate))
    )
    server = EmbeddedServer(ServerSettings.ephemeral(repo, model_control_mode="explicit"))
    server.start().wait_ready()
    supervisor = Supervisor(server, canary_interval_s=1.0, poll_interval_s=0.2)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=4)
    try:
        supervisor.start()
        tensor = grpcclient.InferInput(TEXT_INPUT, [1], "BYTES")
        tensor.set_data_from_numpy(np.array([b"Say hi"], dtype=np.object_))
        stop_at = time.monotonic() + 15
        results: list[tuple[str, str]] = []

        def stream_until() -> None:
            while time.monotonic() < stop_at:
                results.append(stream_once(server.grpc_url, generate, [tensor], 2, 30.0))

        futures = [pool.submit(stream_until) for _ in range(2)]
        time.sleep(2)
        os.kill(server.stub_pids()["tokenizer_0_0"], signal.SIGSEGV)
        for future in futures:
            future.result(timeout=60)
        _wait(lambda: _answers(server, "embed"), 30, "embed answering")
        assert results and all(kind == OK for kind, _ in results), results[:3]
        assert supervisor.health().server_restarts == 0, supervisor.health()
    finally:
        pool.shutdown(wait=False)
        supervisor.stop()
        server.stop()


def test_finding2a_a_flood_past_generates_queue_marks_it_overloaded_and_restarts_nothing(
    tmp_path: Path,
) -> None:
    generate = _generate_model()
    repo = linked_repository(tmp_path / "repo", _pipeline_models(generate))
    server = EmbeddedServer(ServerSettings.ephemeral(repo, model_control_mode="explicit"))
    server.start().wait_ready()
    supervisor = Supervisor(server, canary_interval_s=0.5, canary_timeout_s=5, poll_interval_s=0.2)
    params = supervisor.configs[generate].parameters
    flood = int(params["max_running"]) + int(params["max_queue"]) + 16
    try:
        supervisor.start()
        assert supervisor.health().healthy, supervisor.health()
        pid = server.pid
        tensor = grpcclient.InferInput(TEXT_INPUT, [1], "BYTES")
        tensor.set_data_from_numpy(np.array([b"Tell me a story"], dtype=np.object_))
        states: list[str] = []

        def overloaded() -> bool:
            states.append(supervisor.health().models.get(generate, ""))
            return states[-1].startswith("overloaded")

        # a sustained flood (each refused client comes back): a burst's queue drained between two
        # canary rounds and the state never read "overloaded" (fresh-clone CI runs, 2026-12-05)
        outcomes = _flood_until(
            overloaded, lambda: stream_once(server.grpc_url, generate, [tensor], 64, 120.0), flood
        )
        kinds = [kind for kind, _ in outcomes]
        # the excess got a clean refusal; no accepted stream was cut; nothing hung
        assert "lost" not in kinds and "hung" not in kinds, outcomes
        assert kinds.count(OK) >= int(params["max_running"]), outcomes
        refused = [e for kind, e in outcomes if kind != OK]
        # clean: generate's queue ("overloaded"), the front's open-stream bound (UNAVAILABLE
        # "max_open_streams"), or tritonclient's follow-up on a stream that was refused
        clean = ("overloaded", "UNAVAILABLE", "A new stream should be started")
        assert refused and all(any(c in e for c in clean) for e in refused), refused[:3]
        at_the_front = any("max_open_streams" in e for e in refused)
        # the front's bound (64 streams) may refuse the flood before generate's queue fills
        assert at_the_front or any(s.startswith("overloaded") for s in states), sorted(set(states))
        _wait(lambda: supervisor.health().healthy, 30, "ready again after the flood")
        health = supervisor.health()
        assert server.pid == pid and health.server_restarts == 0 and health.restarts == 0, health
    finally:
        supervisor.stop()
        server.stop()


def test_finding3_after_server_restarts_the_front_reaches_triton_and_nothing_loops(
    tmp_path: Path,
) -> None:
    repo = linked_repository(tmp_path / "repo")
    server = EmbeddedServer(ServerSettings.ephemeral(repo, model_control_mode="explicit"))
    server.start().wait_ready()
    supervisor = Supervisor(
        server, canary_interval_s=0.5, poll_interval_s=0.2,
        backoff=Backoff(base_s=0.5, cap_s=2.0, stable_s=600.0),
    )  # fmt: skip
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        supervisor.start()
        for kills in range(1, 4):
            old = server.pid
            assert old is not None
            os.kill(old, signal.SIGKILL)
            # clients hammer the front while Triton is down: its upstream channel backs off
            while server.pid == old or not server.is_ready():
                with_error = False
                try:
                    client.is_server_ready(client_timeout=1)
                except Exception:
                    with_error = True
                assert with_error or server.pid != old
                time.sleep(0.05)
            _wait(lambda k=kills: supervisor.health().server_restarts >= k, 60, "restarted")  # type: ignore[misc]
            # the front forwards to the new Triton at once (it used to answer "tritonserver not
            # reachable (restarting?)" for minutes, and the canaries restarted it again)
            _wait(lambda: _answers(server, "embed"), 3, "front gRPC answering after a restart")
            assert "exited" in supervisor.health().last_server_restart_reason
        pid = server.pid
        time.sleep(8)  # no traffic: a loop would restart it again
        health = supervisor.health()
        assert health.server_restarts == 3 and server.pid == pid, health
        assert health.healthy and health.front == "ok", health
    finally:
        client.close()
        supervisor.stop()
        server.stop()


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def test_finding8_the_metrics_port_is_held_while_tritonserver_restarts(tmp_path: Path) -> None:
    repo = linked_repository(tmp_path / "repo")
    server = EmbeddedServer(ServerSettings.ephemeral(repo, model_control_mode="explicit"))
    server.start().wait_ready()
    port = server.settings.metrics_port
    try:
        with urllib.request.urlopen(server.metrics_url, timeout=10) as resp:
            assert b"nv_" in resp.read()
        server._stop_triton(timeout_s=10)  # what a restart does first
        assert server.returncode is not None
        assert not _bindable(port), "another process could take the metrics port"
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(server.metrics_url, timeout=10)
        assert err.value.code == 503
        server.restart()
        with urllib.request.urlopen(server.metrics_url, timeout=10) as resp:
            assert b"nv_inference_count" in resp.read()
    finally:
        server.stop()
    assert _bindable(port)
