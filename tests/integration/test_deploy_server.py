"""The deployment's Triton command line on the real embedded Triton 2.51: the image tag's release
equals the embedded server's version, the compose flags are accepted, models without
configs/gpu.pbtxt still load under --model-config-name=gpu, every metric the Grafana dashboard
and the HPA's adapter rule query is exported by this server, and docker-compose.yml's `front`
command and triton healthcheck work on its Unix sockets."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.conftest import ServeFn
from tritonforge.deploy import validate as dv
from tritonforge.headers import ADMIN_HEADER
from tritonforge.runtime.launcher.locate import find_triton
from tritonforge.runtime.serving import EmbeddedServer

pytestmark = pytest.mark.integration

# Flags the embedded launcher owns (paths, addresses, ports on free loopback ports, its socket
# directory: the same runtime.front.settings.triton_listen_args the compose file must use).
LAUNCHER_FLAGS = {
    "--model-repository",
    "--http-address",
    "--http-port",
    "--grpc-address",
    "--grpc-port",
    "--metrics-port",
}
# Options of the compose front this test replaces: the server's socket directory, free ports.
FRONT_OWN_FLAGS = {"--socket-dir", "--host", "--http-port", "--grpc-port"}
COMPOSE_SOCKET_DIR = "/run/tritonforge"
ADMIN_KEY = "compose-test-key"

IDENTITY_CONFIG = """
name: "identity"
backend: "python"
max_batch_size: 8
input [{ name: "x" data_type: TYPE_FP32 dims: [2] }]
output [{ name: "y" data_type: TYPE_FP32 dims: [2] }]
dynamic_batching {}
instance_group [{ kind: KIND_CPU count: 1 }]
"""
# A second copy with the response cache, so that the dashboard's nv_cache_* metrics exist.
CACHED_CONFIG = IDENTITY_CONFIG.replace('"identity"', '"identity_cached"') + (
    "response_cache { enable: true }\n"
)
IDENTITY_MODEL = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())]
            )
            for r in requests
        ]
"""


@pytest.fixture(scope="module")
def compose_args() -> list[str]:
    command = dv.triton_command(dv.compose_document()["services"]["triton"]["command"])
    return [a for a in command[1:] if a.split("=", 1)[0] not in LAUNCHER_FLAGS]


def cache_args() -> list[str]:
    """The response cache (so that the dashboard's nv_cache_* metrics exist)."""
    caches = find_triton().root / "caches"
    return [f"--cache-directory={caches}", "--cache-config=local,size=1048576"]


@pytest.fixture
def deployed(tmp_path: Path, serve: ServeFn, compose_args: list[str]) -> Iterator[EmbeddedServer]:
    """The embedded server started with docker-compose.yml's flags on a one-model repository."""
    model = tmp_path / "repo" / "identity"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(IDENTITY_CONFIG)
    (model / "1" / "model.py").write_text(IDENTITY_MODEL)
    # No configs/gpu.pbtxt: Triton must fall back to config.pbtxt under --model-config-name=gpu.
    assert not (model / "configs").exists()
    cached = tmp_path / "repo" / "identity_cached"
    (cached / "1").mkdir(parents=True)
    (cached / "config.pbtxt").write_text(CACHED_CONFIG)
    (cached / "1" / "model.py").write_text(IDENTITY_MODEL)
    # the admin key is checked by the compose front below, not by Triton
    yield serve(tmp_path / "repo", extra_args=compose_args + cache_args(), restrict_apis=False)


@pytest.fixture
def compose_front(deployed: EmbeddedServer) -> Iterator[tuple[str, str]]:
    """docker-compose.yml's `front` command before the server's sockets, with the key in its
    environment as compose passes it; yields its HTTP and gRPC addresses."""
    command = dv.compose_document()["services"]["front"]["command"]
    args = [a for a in dv.front_args(command) or [] if a.split("=", 1)[0] not in FRONT_OWN_FLAGS]
    proc = subprocess.Popen(  # port 0: the front binds free ones and says which
        [sys.executable, *dv.FRONT_COMMAND[1:], *args, f"--socket-dir={deployed.socket_dir}", "--host=127.0.0.1",
         "--http-port=0", "--grpc-port=0"],
        cwd=dv.PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, dv.ADMIN_KEY_ENV: ADMIN_KEY},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        bound = re.search(r"==> front on \S+: HTTP (\d+), gRPC (\d+)", line)
        assert bound, line
        yield f"127.0.0.1:{bound[1]}", f"127.0.0.1:{bound[2]}"
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as resp:
        body: bytes = resp.read()
    return body


def test_compose_flags_run_on_the_images_triton_release(
    deployed: EmbeddedServer, compose_args: list[str]
) -> None:
    assert "--model-config-name=gpu" in compose_args
    metadata = json.loads(_get(f"http://{deployed.http_url}/v2"))
    assert metadata["version"] == dv.triton_version_for_ngc_tag(dv.ngc_tag())
    with urllib.request.urlopen(f"http://{deployed.http_url}/v2/models/identity/ready") as resp:
        assert resp.status == 200


def test_compose_front_restricts_the_admin_apis_to_its_key(
    compose_front: tuple[str, str],
) -> None:
    http, _ = compose_front
    stats = f"http://{http}/v2/models/identity/stats"
    with pytest.raises(urllib.error.HTTPError) as info:
        _get(stats)
    assert info.value.code == 403
    request = urllib.request.Request(stats, headers={ADMIN_HEADER: ADMIN_KEY})
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 200
    with urllib.request.urlopen(f"http://{http}/v2/health/ready", timeout=10) as resp:
        assert resp.status == 200  # the front's healthcheck and the k8s readiness probe


def test_compose_front_passes_the_grpc_health_service(compose_front: tuple[str, str]) -> None:
    """The Kubernetes startup probe (``grpc: {port: <front's --grpc-port>}``) through the front."""
    _, address = compose_front
    with grpc.insecure_channel(address) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        # HealthCheckRequest{service=""} is empty; the answer is {status: SERVING (1)}
        assert check(b"", timeout=10) == b"\x08\x01"


def test_compose_triton_healthcheck_reads_readiness_on_its_socket(
    deployed: EmbeddedServer, tmp_path: Path
) -> None:
    test = dv.compose_document()["services"]["triton"]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python3", "-c"] and COMPOSE_SOCKET_DIR in test[3]
    code = test[3].replace(COMPOSE_SOCKET_DIR, str(deployed.socket_dir))
    assert subprocess.run([sys.executable, "-c", code], timeout=30).returncode == 0
    missing = test[3].replace(COMPOSE_SOCKET_DIR, str(tmp_path))
    assert subprocess.run([sys.executable, "-c", missing], timeout=30).returncode != 0


def test_dashboard_and_hpa_query_metrics_this_triton_exports(deployed: EmbeddedServer) -> None:
    body = json.dumps(
        {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1.0, 2.0]}]}
    ).encode()
    for model in ("identity", "identity", "identity", "identity_cached", "identity_cached"):
        request = urllib.request.Request(
            f"http://{deployed.http_url}/v2/models/{model}/infer",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert resp.status == 200
    metrics = _get(deployed.metrics_url).decode()
    exported = set(re.findall(r"^(nv_\w+)", metrics, re.MULTILINE))
    # the per-version panel groups by this label; the hit-rate panel needs the second (cached) hit
    assert re.search(r'^nv_inference_request_success\{[^}]*version="1"', metrics, re.MULTILINE)
    hits = re.search(
        r'^nv_cache_num_hits_per_model\{[^}]*model="identity_cached"[^}]*\} (\S+)',
        metrics,
        re.MULTILINE,
    )
    assert hits and float(hits.group(1)) >= 1, "the dashboard's cache hit rate would read 0"
    queries = dv.dashboard_queries() + [r["metricsQuery"] for r in dv.adapter_rules()]
    queries += [r["seriesQuery"] for r in dv.adapter_rules()]
    referenced = dv.referenced_metrics(queries)
    assert "nv_inference_queue_summary_us" in referenced
    assert {"nv_cache_num_hits_per_model", "nv_inference_pending_request_count"} <= referenced
    # nv_gpu_* exist on GPU hosts only (--allow-gpu-metrics with a visible GPU)
    on_cpu = {m for m in referenced if not m.startswith("nv_gpu_")}
    assert on_cpu <= exported, f"not exported by Triton 2.51: {sorted(on_cpu - exported)}"
