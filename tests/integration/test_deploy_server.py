"""The deployment's Triton command line on the real embedded Triton 2.51: the image tag's release
equals the embedded server's version, the compose flags are accepted, models without
configs/gpu.pbtxt still load under --model-config-name=gpu, and every metric the Grafana dashboard
and the HPA's adapter rule query is exported by this server."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ServeFn
from tritonforge.deploy import validate as dv
from tritonforge.runtime.locate import find_triton
from tritonforge.runtime.server import ADMIN_HEADER, EmbeddedServer

pytestmark = pytest.mark.integration

# Flags the embedded launcher owns (paths, addresses, ports on free loopback ports).
LAUNCHER_FLAGS = {"--model-repository", "--http-port", "--grpc-port", "--metrics-port"}

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
    # compose's own restricted-API flags (key $(TRITONFORGE_ADMIN_KEY)) instead of the launcher's
    yield serve(tmp_path / "repo", extra_args=compose_args + cache_args(), restrict_apis=False)


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


def test_compose_restricts_the_admin_apis_to_its_key(deployed: EmbeddedServer) -> None:
    stats = f"http://{deployed.http_url}/v2/models/identity/stats"
    with pytest.raises(urllib.error.HTTPError) as info:
        _get(stats)
    assert info.value.code in (401, 403, 503) or "restricted" in info.value.read().decode()
    request = urllib.request.Request(stats, headers={ADMIN_HEADER: dv.ADMIN_KEY_REF})
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 200


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
    exported = set(re.findall(r"^(nv_\w+)", _get(deployed.metrics_url).decode(), re.MULTILINE))
    queries = dv.dashboard_queries() + [r["metricsQuery"] for r in dv.adapter_rules()]
    queries += [r["seriesQuery"] for r in dv.adapter_rules()]
    referenced = dv.referenced_metrics(queries)
    assert "nv_inference_queue_summary_us" in referenced
    assert {"nv_cache_num_hits_per_model", "nv_inference_pending_request_count"} <= referenced
    # nv_gpu_* exist on GPU hosts only (--allow-gpu-metrics with a visible GPU)
    on_cpu = {m for m in referenced if not m.startswith("nv_gpu_")}
    assert on_cpu <= exported, f"not exported by Triton 2.51: {sorted(on_cpu - exported)}"
