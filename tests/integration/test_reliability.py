"""Worst days, each against the real embedded Triton: a crashed stub, SIGTERM under load, a
version switch under load, and the hardened defaults."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import PROJECT_ROOT
from tests.integration.reliability import MINIMAL, Load, Outcome, linked_repository, text_inputs
from tritonforge.headers import ADMIN_HEADER
from tritonforge.runtime.errors import ModelLoadError
from tritonforge.runtime.launcher.settings import ServerSettings, free_port
from tritonforge.runtime.serving import EmbeddedServer
from tritonforge.runtime.supervisor.supervisor import Supervisor

pytestmark = pytest.mark.integration


def test_killed_stub_fails_fast_and_supervisor_restores_it_within_30s(tmp_path: Path) -> None:
    repo = linked_repository(
        tmp_path / "repo", (*MINIMAL, "encoder_int8", "fused_int8", "embed_int8")
    )
    server = EmbeddedServer(ServerSettings.ephemeral(repo, model_control_mode="explicit"))
    server.start().wait_ready()
    supervisor = Supervisor(
        server, ["embed", "embed_int8"], canary_interval_s=1.0, poll_interval_s=0.2
    )
    try:
        supervisor.start()
        assert supervisor.health().healthy
        victim_load = Load(server.grpc_url, "embed_int8", timeout_s=10.0).start()
        other_load = Load(server.grpc_url, "embed", timeout_s=10.0).start()
        other_http = Load(server.http_url, "embed", timeout_s=10.0, protocol="http").start()
        # the project's client rides out the restart: it retries the transient errors
        retrying = Load(
            server.grpc_url, "embed_int8", workers=1, timeout_s=30.0, protocol="retrying-grpc"
        ).start()
        victim_load.wait_for(10)
        victim = server.stub_pids()["fused_int8_0_0"]  # embed_int8's one step
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        recovered_s = None
        while time.monotonic() - killed_at < 30:
            health = supervisor.health()
            if health.healthy and health.restarts >= 1:
                recovered_s = time.monotonic() - killed_at
                break
            time.sleep(0.2)

        def after_recovery() -> list[Outcome]:
            since_kill_s = killed_at - victim_load.t0
            return [
                o
                for o in list(victim_load.outcomes)
                if recovered_s is not None and o.started_s - since_kill_s > recovered_s
            ]

        # a request caught by the crash may run to its timeout: wait for fresh ones
        deadline = time.monotonic() + victim_load.timeout_s + 5
        while len(after_recovery()) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        victim_load.stop()
        other_load.stop()
        other_http.stop()
        retrying.stop()
        assert recovered_s is not None, f"not recovered within 30 s: {supervisor.health()}"
        assert server.stub_pids()["fused_int8_0_0"] != victim
        # nothing hung past the client timeout
        for load in (victim_load, other_load):
            assert max(o.latency_s for o in load.outcomes) < load.timeout_s + 1.0
        # after recovery the victim model answers again
        after = after_recovery()
        assert after and not [o for o in after if o.error], after[:3]
        # the other pipeline kept serving throughout (explicit control reloads only the broken
        # model), over gRPC and over HTTP through the front
        assert not other_load.failures, other_load.failures[:3]
        assert other_http.outcomes and not other_http.failures, other_http.failures[:3]
        assert retrying.outcomes and not retrying.failures, retrying.failures[:3]
        client = grpcclient.InferenceServerClient(server.grpc_url)
        assert client.infer("embed_int8", text_inputs(["back"])).as_numpy("embedding").shape == (
            1,
            384,
        )
    finally:
        supervisor.stop()
        server.stop()


def _ready(http_port: int) -> int:
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=1
        ) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def test_sigterm_under_load_flips_readiness_completes_in_flight_and_exits_clean(
    tmp_path: Path,
) -> None:
    """SIGTERM: the pipeline health endpoint turns 503 at once; the load (like a load balancer)
    stops when it sees that; every request sent until then completes; exit 0; nothing left."""
    repo = linked_repository(tmp_path / "repo")
    grpc_port = free_port()
    args = [
        sys.executable, "-m", "tritonforge.runtime", "serve", "--quiet", "--no-supervise",
        "--model-repository", str(repo), "--http-port", str(free_port()),
        "--grpc-port", str(grpc_port), "--metrics-port", str(free_port()),
        "--health-port", "0", "--exit-timeout-s", "20",
    ]  # fmt: skip
    proc = subprocess.Popen(
        args, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    reader = threading.Thread(
        target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True
    )  # type: ignore[union-attr]
    reader.start()
    try:
        deadline = time.monotonic() + 90
        health_url = ""
        while not health_url:
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            health_url = next((ln.split()[3] for ln in lines if "pipeline health:" in ln), "")
            time.sleep(0.2)
        assert _status(health_url) == 200
        family = [proc.pid, *(p.pid for p in psutil.Process(proc.pid).children(recursive=True))]
        load = Load(f"127.0.0.1:{grpc_port}", "embed", workers=4, timeout_s=20.0).start()
        load.wait_for(20)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        flipped_s = None
        while time.monotonic() - signalled < 5:
            if _status(health_url) != 200:
                flipped_s = time.monotonic() - signalled
                break
            time.sleep(0.02)
        load.stop()
        proc.wait(timeout=60)
        reader.join(timeout=5)
    finally:
        if proc.poll() is None:  # a failed assertion: SIGTERM so the launcher stops its server
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    out = "".join(lines)
    assert flipped_s is not None and flipped_s < 2.0, (
        f"health still 200 {flipped_s} s after SIGTERM"
    )
    assert proc.returncode == 0, out
    assert "drained" in out, out
    # Requests sent after SIGTERM (before the load saw the 503) are refused cleanly by the
    # draining front (issue #19: UNAVAILABLE "shutting down"); nothing else may fail.
    unclean = [o for o in load.failures if "UNAVAILABLE" not in o.error.upper()]
    assert load.outcomes and not unclean, unclean[:3]
    sent_before = [o for o in load.failures if o.started_s < signalled - load.t0 - 0.5]
    assert not sent_before, sent_before[:3]  # what was in flight before SIGTERM completed
    assert max(o.latency_s for o in load.outcomes) < load.timeout_s
    assert not [
        pid for pid in family if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"
    ]
    assert not [p for p in os.listdir("/dev/shm") if p.startswith(f"tritonforge_{proc.pid}_")]


def test_version_switch_under_load_has_zero_failures_and_a_broken_version_keeps_the_old(
    tmp_path: Path,
) -> None:
    repo = linked_repository(tmp_path / "repo", copy=("encoder_fp32",))
    server = EmbeddedServer(ServerSettings.ephemeral(repo, model_control_mode="explicit"))
    server.start().wait_ready()
    try:
        load = Load(server.grpc_url, "embed", workers=3).start()
        load.wait_for(10)
        v1 = repo / "encoder_fp32" / "1"
        v2 = repo / "encoder_fp32" / "2"
        v2.mkdir()
        for f in ("model.onnx", "model.onnx.sha256"):
            os.symlink((v1 / f).resolve(), v2 / f)
        server.load_model("encoder_fp32")
        load.wait_for(len(load.outcomes) + 10)
        v3 = repo / "encoder_fp32" / "3"
        v3.mkdir()
        (v3 / "model.onnx").write_bytes(b"not an onnx model")
        with pytest.raises(ModelLoadError) as info:
            server.load_model("encoder_fp32")
        load.wait_for(len(load.outcomes) + 10)
        load.stop()
        assert not load.failures, load.failures[:3]
        assert "encoder_fp32" in str(info.value)
        index = json.loads(_post(server, "index"))
        states = {(m["name"], m.get("version")): m.get("state") for m in index}
        assert states[("encoder_fp32", "2")] == "READY", states
        client = grpcclient.InferenceServerClient(server.grpc_url)
        assert client.infer("embed", text_inputs(["still v2"])).as_numpy("embedding").shape == (
            1,
            384,
        )
    finally:
        server.stop()


def _post(server: EmbeddedServer, path: str, headers: dict[str, str] | None = None) -> str:
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/repository/{path}",
        data=b"{}",
        method="POST",
        headers=server.admin_headers if headers is None else headers,
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return str(resp.read().decode())


def test_hardened_defaults(pipeline_server: EmbeddedServer) -> None:
    server = pipeline_server
    # admin APIs need the header, on both protocols
    for path in (
        "v2/models/embed/config",
        "v2/models/embed/stats",
        "v2/trace/setting",
        "v2/logging",
    ):
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"http://{server.http_url}/{path}", timeout=5)
        assert info.value.code in (401, 403), (path, info.value.code)
        ok = urllib.request.Request(
            f"http://{server.http_url}/{path}", headers=server.admin_headers
        )
        with urllib.request.urlopen(ok, timeout=5) as resp:
            assert resp.status == 200
    with pytest.raises(urllib.error.HTTPError):
        _post(server, "index", headers={})
    assert json.loads(_post(server, "index"))
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException, match=r"restricted|expecting header"):
        client.get_model_config("embed")
    assert (
        client.get_model_config("embed", headers=server.admin_grpc_headers).config.name == "embed"
    )
    with pytest.raises(InferenceServerException):
        client.get_system_shared_memory_status()
    # inference, health and metadata stay open
    assert client.is_server_ready() and client.get_model_metadata("embed").name == "embed"
    # loopback only; metrics on their own port, not on the HTTP port
    listening = {
        c.laddr
        for c in psutil.Process(server.pid).net_connections(kind="inet")
        if c.status == "LISTEN"
    }
    assert listening and all(
        addr.ip.removeprefix("::ffff:") == "127.0.0.1" for addr in listening
    ), listening
    with urllib.request.urlopen(server.metrics_url, timeout=5) as resp:
        assert b"nv_inference_request_success" in resp.read()
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(f"http://{server.http_url}/metrics", timeout=5)
    assert ADMIN_HEADER == "x-tritonforge-admin"


def _burst(
    url: str, model: str, requests: int, texts_per_request: int, timeout_s: float
) -> list[tuple[float, str]]:
    """Fire ``requests`` concurrent async requests; returns (latency_s, error) per request."""
    client = grpcclient.InferenceServerClient(url)
    done = threading.Semaphore(0)
    results: list[tuple[float, str]] = []
    lock = threading.Lock()

    def callback(start: float):  # type: ignore[no-untyped-def]
        def on_done(result: object, error: object) -> None:
            with lock:
                results.append((time.monotonic() - start, str(error) if error else ""))
            done.release()

        return on_done

    text = [
        "an overloaded server must refuse the excess quickly and serve the rest"
    ] * texts_per_request
    for _ in range(requests):
        client.async_infer(
            model, text_inputs(text), callback(time.monotonic()), client_timeout=timeout_s
        )
    for _ in range(requests):
        assert done.acquire(timeout=timeout_s + 30), "a request never completed"
    client.close()
    return results


@pytest.mark.parametrize(
    ("model", "queue_owner"),
    [("embed_bls", "embed_bls"), ("embed", "fused_fp32")],
    ids=["bls", "ensemble-via-its-fused-step-queue"],
)
def test_overload_rejects_the_excess_fast_and_serves_the_rest(
    pipeline_server: EmbeddedServer, model: str, queue_owner: str
) -> None:
    """The queue owner holds at most ``max_queue_size`` requests (its config.pbtxt): a burst of
    several times that gets fast UNAVAILABLE for the excess; every accepted request succeeds.
    Through an ensemble the front refuses the excess itself (``model_queue_admission``: a step
    refusal may leave the request unanswered in Triton 2.51, core#466), naming the step's bound
    read from its served config; a plain model's excess is Triton's own refusal."""
    from tritonforge.repository import load_model_config

    config = load_model_config(Path(pipeline_server.settings.model_repository), queue_owner)
    policy = config.raw["dynamic_batching"]["default_queue_policy"]
    queue_size = int(policy["max_queue_size"])
    queue_timeout_s = int(policy["default_timeout_microseconds"]) / 1e6
    results = _burst(pipeline_server.grpc_url, model, 6 * queue_size, 8, timeout_s=60.0)
    rejected = [(t, e) for t, e in results if e]
    accepted = [t for t, e in results if not e]
    assert rejected and accepted, f"{len(rejected)} rejected, {len(accepted)} accepted"
    for latency_s, error in rejected:
        assert "UNAVAILABLE" in error and "queue" in error.lower(), error
        if queue_owner != model:  # the front's refusal, naming the step's bound
            assert f"{model}: overloaded: queue full" in error, error
            assert f"{queue_owner} max_queue_size {queue_size}" in error, error
        assert latency_s < queue_timeout_s, (latency_s, error)
    # refused on arrival, not after waiting out the queue timeout
    median_rejection_s = sorted(t for t, _ in rejected)[len(rejected) // 2]
    assert median_rejection_s < queue_timeout_s / 2, (
        f"median rejection took {median_rejection_s:.2f} s"
    )
    # nobody waited in the queue past its timeout (queue timeout + one execution)
    assert max(accepted) < queue_timeout_s + 10, max(accepted)
    client = grpcclient.InferenceServerClient(pipeline_server.grpc_url)
    assert client.infer("embed_bls", text_inputs(["after the storm"])).as_numpy(
        "embedding"
    ).shape == (1, 384)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_client_retries_real_unavailable_with_backoff_but_never_restricted_or_4xx(
    tmp_path: Path, protocol: str
) -> None:
    """A stage that is not loaded answers UNAVAILABLE (503): the client retries it with backoff
    until its deadline. Triton's own "restricted" UNAVAILABLE and 4xx are never retried."""
    from tritonforge.client.errors import InvalidRequestError, ServerUnavailableError
    from tritonforge.client.retry import translate
    from tritonforge.client.sync import EmbeddingClient

    # embed_bls declares an int8 route, but encoder_int8 is not in this repository
    repo = linked_repository(tmp_path / "repo", (*MINIMAL, "embed_bls"))
    server = EmbeddedServer(ServerSettings.ephemeral(repo))
    server.start().wait_ready()
    try:
        url = server.http_url if protocol == "http" else server.grpc_url
        with EmbeddingClient(
            url, protocol, pipeline="bls", variant="int8", max_attempts=4, deadline_s=30
        ) as c:
            started = time.monotonic()
            with pytest.raises(ServerUnavailableError) as unavailable:
                c.embed(["needs the int8 encoder"])
            elapsed_s = time.monotonic() - started
            assert unavailable.value.attempts == 4, unavailable.value
            assert "encoder_int8" in str(unavailable.value)
            # it backed off between the tries: at least the smallest jittered waits
            assert elapsed_s >= sum(c.policy.backoff_s(r, rand=lambda: 1.0) for r in (1, 2, 3))
        with EmbeddingClient(url, protocol, pipeline="bls", max_attempts=4) as c:
            with pytest.raises(InvalidRequestError) as invalid:
                c.embed([" "])
            assert invalid.value.attempts == 1
        # the real "restricted" answer of this server is classified as permanent
        module = httpclient_or_grpc(protocol)
        raw = module.InferenceServerClient(url)
        with pytest.raises(InferenceServerException) as restricted:
            raw.get_model_config("embed")
        error = translate(restricted.value, "get_model_config('embed')")
        assert not error.transient, error
    finally:
        server.stop()


def httpclient_or_grpc(protocol: str) -> object:
    import tritonclient.http as httpclient

    return httpclient if protocol == "http" else grpcclient
