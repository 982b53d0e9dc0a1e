"""The foundation on the real embedded Triton: tiny ONNX and TorchScript models served by our
Python-based backends over HTTP and gRPC, batched, and started/stopped cleanly."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import onnxruntime as ort
import psutil
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import PROJECT_ROOT
from tritonforge.integrity import write_sidecar
from tritonforge.runtime.errors import ModelLoadError, ServerStartError
from tritonforge.runtime.launcher.settings import ServerSettings, free_port
from tritonforge.runtime.serving import EmbeddedServer

pytestmark = pytest.mark.integration


class Tiny(torch.nn.Module):
    """y = masked weighted row sums (batch, seq, 1); z = 3x (batch, seq, 4)."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        weights = torch.arange(1, 5, dtype=torch.float32)
        y = (x * weights).sum(-1, keepdim=True) * mask.unsqueeze(-1).to(torch.float32)
        return y, x * 3.0


ONNX_CONFIG = """
name: "tiny_onnx"
backend: "onnxruntime"
max_batch_size: 16
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 4 ] allow_ragged_batch: true },
        { name: "mask" data_type: TYPE_INT64 dims: [ -1 ] allow_ragged_batch: true } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ -1, 1 ] },
         { name: "z" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
dynamic_batching { max_queue_delay_microseconds: 200000 }
parameters { key: "pad_values" value: { string_value: "x=0,mask=0" } }
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
"""

TS_CONFIG = """
name: "tiny_ts"
backend: "pytorch"
max_batch_size: 16
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ -1, 4 ] allow_ragged_batch: true },
        { name: "INPUT__1" data_type: TYPE_INT64 dims: [ -1 ] allow_ragged_batch: true } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ -1, 1 ] },
         { name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
dynamic_batching { max_queue_delay_microseconds: 200000 }
parameters { key: "pad_values" value: { string_value: "INPUT__0=0,INPUT__1=0" } }
parameters { key: "axis_names" value: { string_value:
  "INPUT__0:batch,seq,-;INPUT__1:batch,seq;OUTPUT__0:batch,seq,-;OUTPUT__1:batch,seq,-" } }
parameters { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "1" } }
"""


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("repo")
    model = Tiny().eval()
    example = (torch.randn(2, 5, 4), torch.ones(2, 5, dtype=torch.int64))
    (repo / "tiny_onnx" / "1").mkdir(parents=True)
    (repo / "tiny_onnx" / "config.pbtxt").write_text(ONNX_CONFIG)
    axes = {0: "batch_size", 1: "sequence_length"}
    torch.onnx.export(
        model,
        example,
        str(repo / "tiny_onnx" / "1" / "model.onnx"),
        input_names=["x", "mask"],
        output_names=["y", "z"],
        dynamic_axes={"x": axes, "mask": axes, "y": axes, "z": axes},
        opset_version=17,
        dynamo=False,
    )
    (repo / "tiny_ts" / "1").mkdir(parents=True)
    (repo / "tiny_ts" / "config.pbtxt").write_text(TS_CONFIG)
    torch.jit.trace(model, example).save(str(repo / "tiny_ts" / "1" / "model.pt"))
    write_sidecar(repo / "tiny_onnx" / "1" / "model.onnx")  # the backends refuse artifacts
    write_sidecar(repo / "tiny_ts" / "1" / "model.pt")  # without a checksum sidecar
    return repo


@pytest.fixture(scope="module")
def tiny_server(tiny_repo: Path) -> EmbeddedServer:
    server = EmbeddedServer(ServerSettings.ephemeral(tiny_repo))
    server.start()
    server.wait_ready()
    yield server  # type: ignore[misc]
    server.stop()


def sample(rows: int, length: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, length, 4)).astype(np.float32)
    mask = np.ones((rows, length), dtype=np.int64)
    mask[:, length - 1 :] = rng.integers(0, 2, size=(rows, 1))
    return x, mask


def names(model: str) -> tuple[list[str], list[str]]:
    if model == "tiny_onnx":
        return ["x", "mask"], ["y", "z"]
    return ["INPUT__0", "INPUT__1"], ["OUTPUT__0", "OUTPUT__1"]


def infer(
    module: object, url: str, model: str, x: np.ndarray, mask: np.ndarray
) -> list[np.ndarray]:
    client = module.InferenceServerClient(url)  # type: ignore[attr-defined]
    in_names, out_names = names(model)
    inputs = [
        module.InferInput(in_names[0], list(x.shape), "FP32"),  # type: ignore[attr-defined]
        module.InferInput(in_names[1], list(mask.shape), "INT64"),  # type: ignore[attr-defined]
    ]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(mask)
    result = client.infer(model, inputs)
    return [result.as_numpy(n) for n in out_names]


@pytest.mark.parametrize("model", ["tiny_onnx", "tiny_ts"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_served_outputs_equal_in_process(
    tiny_server: EmbeddedServer, tiny_repo: Path, model: str, protocol: str
) -> None:
    module, url = (
        (httpclient, tiny_server.http_url)
        if protocol == "http"
        else (grpcclient, tiny_server.grpc_url)
    )
    session = ort.InferenceSession(str(tiny_repo / "tiny_onnx" / "1" / "model.onnx"))
    scripted = torch.jit.load(str(tiny_repo / "tiny_ts" / "1" / "model.pt"))

    def reference(x: np.ndarray, m: np.ndarray) -> list[np.ndarray]:
        if model == "tiny_onnx":
            return list(session.run(None, {"x": x, "mask": m}))
        return [t.numpy() for t in scripted(torch.from_numpy(x), torch.from_numpy(m))]

    for rows, length in [(1, 1), (3, 7), (16, 2)]:
        x, mask = sample(rows, length, seed=rows * 100 + length)
        got = infer(module, url, model, x, mask)
        want = reference(x, mask)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def model_stats(server: EmbeddedServer, model: str) -> tuple[int, int]:
    url = f"http://{server.http_url}/v2/models/{model}/stats"
    request = urllib.request.Request(url, headers=server.admin_headers)
    with urllib.request.urlopen(request) as resp:
        stats = json.load(resp)["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


@pytest.mark.parametrize("model", ["tiny_onnx", "tiny_ts"])
def test_concurrent_requests_of_different_lengths_run_as_one_batch(
    tiny_server: EmbeddedServer, model: str
) -> None:
    """Eight concurrent single-row requests of lengths 1..8: the dynamic batcher hands them to one
    execute (200 ms queue delay; ``allow_ragged_batch`` lets it group different lengths, which only a
    backend that pads itself can take) and the backend pads them into one inference; each answer is
    cut back to its own length and equals the unbatched result."""
    before_inf, before_exec = model_stats(tiny_server, model)
    client = grpcclient.InferenceServerClient(tiny_server.grpc_url)
    in_names, out_names = names(model)
    results: dict[int, object] = {}
    done = threading.Event()
    lock = threading.Lock()
    samples = {length: sample(1, length, seed=length) for length in range(1, 9)}

    def callback(length: int):  # type: ignore[no-untyped-def]
        def on_done(result: object, error: object) -> None:
            with lock:
                results[length] = error or result
                if len(results) == len(samples):
                    done.set()

        return on_done

    for length, (x, mask) in samples.items():
        inputs = [
            grpcclient.InferInput(in_names[0], list(x.shape), "FP32"),
            grpcclient.InferInput(in_names[1], list(mask.shape), "INT64"),
        ]
        inputs[0].set_data_from_numpy(x)
        inputs[1].set_data_from_numpy(mask)
        client.async_infer(model, inputs, callback(length))
    assert done.wait(30), "requests did not complete"
    for length, (x, mask) in samples.items():
        result = results[length]
        assert isinstance(result, grpcclient.InferResult), result
        z = result.as_numpy(out_names[1])
        assert z.shape == (1, length, 4)
        np.testing.assert_allclose(z, x * 3.0, rtol=1e-6)
        y = result.as_numpy(out_names[0])
        np.testing.assert_allclose(y[..., 0], (x * np.arange(1, 5)).sum(-1) * mask, rtol=1e-5)
    after_inf, after_exec = model_stats(tiny_server, model)
    inferences, executions = after_inf - before_inf, after_exec - before_exec
    assert inferences == 8
    assert executions < inferences, f"{executions} executions for {inferences} inferences"


def test_wrong_dtype_is_invalid_argument_and_server_keeps_serving(
    tiny_server: EmbeddedServer,
) -> None:
    client = grpcclient.InferenceServerClient(tiny_server.grpc_url)
    x = np.zeros((1, 2, 4), np.float64)
    mask = np.ones((1, 2), np.int64)
    inputs = [
        grpcclient.InferInput("x", [1, 2, 4], "FP64"),
        grpcclient.InferInput("mask", [1, 2], "INT64"),
    ]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(mask)
    pids = tiny_server.stub_pids()
    with pytest.raises(Exception, match="x") as info:
        client.infer("tiny_onnx", inputs)
    assert "INVALID_ARG" in str(info.value)
    good = infer(grpcclient, tiny_server.grpc_url, "tiny_onnx", *sample(1, 2, 0))
    assert good[1].shape == (1, 2, 4)
    assert tiny_server.stub_pids() == pids


def test_broken_config_fails_fast_naming_the_model(tiny_repo: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "config.pbtxt").write_text(
        'name: "broken"\nbackend: "onnxruntime"\nmax_batch_size: [\n'
    )
    (repo / "missing_file" / "1").mkdir(parents=True)
    (repo / "missing_file" / "config.pbtxt").write_text(
        ONNX_CONFIG.replace('name: "tiny_onnx"', 'name: "missing_file"')
    )
    server = EmbeddedServer(ServerSettings.ephemeral(repo, ready_timeout_s=60))
    started = time.monotonic()
    with pytest.raises(ModelLoadError) as info:
        server.start().wait_ready()
    assert time.monotonic() - started < 60
    assert set(info.value.failures) == {"broken", "missing_file"}
    assert "model.onnx" in info.value.failures["missing_file"]
    assert server.leftover_processes() == []
    assert server.shm_regions() == []


def serve_cli(repo: Path, health_port: int = 0) -> tuple[subprocess.Popen[str], int]:
    http_port = free_port()
    args = [
        sys.executable, "-m", "tritonforge.runtime", "serve", "--quiet",
        "--model-repository", str(repo),
        "--http-port", str(http_port),
        "--grpc-port", str(free_port()),
        "--metrics-port", str(free_port()),
        "--health-port", str(health_port),
    ]  # fmt: skip
    proc = subprocess.Popen(
        args, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    return proc, http_port


def test_cli_broken_repository_exits_nonzero_naming_the_model(tmp_path: Path) -> None:
    (tmp_path / "bad_model" / "1").mkdir(parents=True)
    (tmp_path / "bad_model" / "config.pbtxt").write_text('name: "bad_model"\nbackend: "nope"\n')
    proc, _ = serve_cli(tmp_path)
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        _terminate(proc)
    assert proc.returncode != 0
    assert "bad_model" in out and "failed to load" in out


def shm_of(pid: int) -> list[str]:
    """The launcher's regions: in /dev/shm, or in its tritonserver's private tmpfs."""
    dirs = [Path("/dev/shm")]
    if psutil.pid_exists(pid):
        dirs += [Path(f"/proc/{c.pid}/root/dev/shm") for c in psutil.Process(pid).children()]
    found = []
    for d in dirs:
        with contextlib.suppress(OSError):
            found += [p.name for p in d.iterdir() if p.name.startswith(f"tritonforge_{pid}_")]
    return found


def _terminate(proc: subprocess.Popen[str]) -> None:
    """Cleanup after a failed assertion: SIGTERM lets the launcher stop its server too."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_cli_sigterm_is_graceful_and_leaves_nothing(tiny_repo: Path) -> None:
    proc, http_port = serve_cli(tiny_repo)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=1
                ):
                    break
            except OSError:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                time.sleep(0.3)
        else:
            pytest.fail("server did not become ready")
        assert shm_of(proc.pid), "expected the Python backend's shared-memory regions while serving"
        children = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        assert len(children) >= 2, "expected tritonserver and its Python stubs"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        _terminate(proc)
    assert proc.returncode == 0, out
    assert "leftover processes: []" in out
    for pid in children:
        assert not Path(f"/proc/{pid}").exists(), f"tritonserver {pid} still running"
    assert shm_of(proc.pid) == []


def test_supervisor_restarts_the_server_when_a_stub_dies(tiny_repo: Path) -> None:
    """Model control ``none``: the supervisor restarts the whole server on the same ports."""
    from tritonforge.runtime.supervisor.supervisor import Supervisor

    server = EmbeddedServer(ServerSettings.ephemeral(tiny_repo))
    server.start().wait_ready()
    supervisor = Supervisor(server, canary_interval_s=0.5, poll_interval_s=0.1)
    try:
        supervisor.start()
        assert sorted(supervisor.models) == ["tiny_onnx", "tiny_ts"]
        assert supervisor.health().healthy, supervisor.health()
        old_pid = server.pid
        victim = server.stub_pids()["tiny_ts_0_0"]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not (supervisor.health().healthy and supervisor.health().restarts == 1):
            assert time.monotonic() < deadline, supervisor.health()
            time.sleep(0.1)
        assert server.pid != old_pid
        assert "tiny_ts_0_0" in supervisor.health().last_restart_reason
        got = infer(grpcclient, server.grpc_url, "tiny_ts", *sample(2, 3, seed=1))
        assert got[1].shape == (2, 3, 4)
    finally:
        supervisor.stop()
        server.stop()


def test_cli_taken_ports_say_which_flag_to_change(tiny_repo: Path) -> None:
    """A taken health port or HTTP port: exit 1 naming the flag, and no server left running."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc, http_port = serve_cli(tiny_repo, health_port=port)
        try:
            out, _ = proc.communicate(timeout=90)
        finally:
            _terminate(proc)
        assert proc.returncode == 1, out
        assert "--health-port" in out and "Traceback" not in out, out
        with pytest.raises(OSError):  # the server it had started was stopped
            urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/live", timeout=2)

        busy = EmbeddedServer(ServerSettings.ephemeral(tiny_repo, http_port=port))
        with pytest.raises(ServerStartError, match="--http-port"):
            busy.start().wait_ready()
        assert busy.leftover_processes() == []
