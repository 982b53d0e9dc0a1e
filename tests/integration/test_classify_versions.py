"""Two versions of a classifier side by side: pinning, the canary split, per-version metrics and
the response cache, on the real embedded Triton over HTTP and gRPC.

Version 1 and 2 are tiny random RoBERTa classifiers with different weights (same tokenizer),
exported into one pipeline (``extra_versions``) whose BLS splits unpinned traffic 30/70.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests import tiny_checkpoints
from tests.integration.reliability import Load
from tritonforge.bls_parameters import canary_bucket
from tritonforge.export.encoder import Options, export_pipeline
from tritonforge.export.pipeline_spec import Canary, ModelVersion
from tritonforge.export.specs.from_pretrained import pipeline_from_pretrained
from tritonforge.runtime.launcher.cache import cache_args
from tritonforge.runtime.launcher.settings import ServerSettings
from tritonforge.runtime.serving import EmbeddedServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TEXTS = ["The service answered every request in time.", "I really did not like it!"]
WEIGHTS = ((1, 30), (2, 70))


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("ab-checkpoints")
    return {
        n: tiny_checkpoints.roberta(root / f"v{n}", tiny_checkpoints.LABELS, seed=n) for n in (1, 2)
    }


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, versions: dict[int, Path]
) -> Iterator[EmbeddedServer]:
    repo = tmp_path_factory.mktemp("ab") / "model_repository"
    v2 = pipeline_from_pretrained(versions[2], "classification", "ab", max_length=64).encoder
    spec = pipeline_from_pretrained(
        versions[1],
        "classification",
        "ab",
        max_length=64,
        variants=("fp32",),
        extra_versions=(ModelVersion(2, v2),),
        canary=Canary(WEIGHTS),
        response_cache=True,
    )
    export_pipeline(spec, Options(repo=repo, formats=("onnx",)), progress=lambda _: None)
    settings = ServerSettings.ephemeral(
        repo, extra_args=cache_args(1 << 20), model_control_mode="explicit"
    )
    with EmbeddedServer(settings) as server:
        yield server  # started and ready; stopped on the way out


def probabilities(directory: Path) -> np.ndarray:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model = AutoModelForSequenceClassification.from_pretrained(str(directory)).eval()
    with torch.inference_mode():
        return np.stack(
            [
                torch.softmax(model(**tokenizer(t, return_tensors="pt")).logits, -1)[0].numpy()
                for t in TEXTS
            ]
        )


def infer(server: EmbeddedServer, protocol: str, model: str, **kw: Any) -> Any:
    data = np.array([t.encode() for t in TEXTS], dtype=np.object_).reshape(-1, 1)
    lib: Any = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    with lib.InferenceServerClient(url) as client:
        tensor = lib.InferInput("text", list(data.shape), "BYTES")
        tensor.set_data_from_numpy(data)
        return client.infer(model, [tensor], **kw)


def metric(server: EmbeddedServer, name: str, **labels: str) -> float:
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_pinned_version_answers_and_says_so(
    server: EmbeddedServer, versions: dict[int, Path], protocol: str
) -> None:
    for n, directory in versions.items():
        result = infer(server, protocol, "ab_bls", parameters={"version": n})
        np.testing.assert_allclose(
            result.as_numpy("probabilities"), probabilities(directory), atol=1e-4
        )
        assert result.as_numpy("model_version").reshape(-1).tolist() == [n] * len(TEXTS)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_unknown_version_is_invalid_argument(server: EmbeddedServer, protocol: str) -> None:
    with pytest.raises(InferenceServerException, match=r"'version'=3 is unknown") as err:
        infer(server, protocol, "ab_bls", parameters={"version": 3})
    assert "400" in str(err.value.status()) or "INVALID_ARGUMENT" in str(err.value.status())


def test_canary_split_is_deterministic_per_request_id(server: EmbeddedServer) -> None:
    seen: dict[str, int] = {}
    for i in range(40):
        rid = f"req-{i}"
        got = int(infer(server, "grpc", "ab_bls", request_id=rid).as_numpy("model_version")[0][0])
        bucket = canary_bucket(rid)
        assert got == (1 if bucket < WEIGHTS[0][1] else 2), rid
        seen[rid] = got
    assert set(seen.values()) == {1, 2}
    again = int(infer(server, "http", "ab_bls", request_id="req-7").as_numpy("model_version")[0][0])
    assert again == seen["req-7"]


def test_standard_model_version_on_the_encoder_and_per_version_metrics(
    server: EmbeddedServer,
) -> None:
    before = {
        n: metric(server, "nv_inference_request_success", model="ab_encoder_fp32", version=str(n))
        for n in (1, 2)
    }
    ids = np.array([[0, 10, 20, 2]], dtype=np.int64)
    logits = {}
    with httpclient.InferenceServerClient(server.http_url) as client:
        for n in (1, 2):
            inputs = []
            for name, value in (("input_ids", ids), ("attention_mask", np.ones_like(ids))):
                tensor = httpclient.InferInput(name, list(value.shape), "INT64")
                tensor.set_data_from_numpy(value)
                inputs.append(tensor)
            out = httpclient.InferRequestedOutput("logits", class_count=3)
            result = client.infer("ab_encoder_fp32", inputs, model_version=str(n), outputs=[out])
            top = result.as_numpy("logits")[0][0].decode().split(":")
            assert top[2] in tiny_checkpoints.LABELS
            logits[n] = top
    assert logits[1] != logits[2]  # different weights
    after = {
        n: metric(server, "nv_inference_request_success", model="ab_encoder_fp32", version=str(n))
        for n in (1, 2)
    }
    assert all(after[n] >= before[n] + 1 for n in (1, 2))


def test_identical_requests_hit_the_response_cache(server: EmbeddedServer) -> None:
    # the ensemble's one step is its fused model, which caches as the encoder would
    hits = metric(server, "nv_cache_num_hits_per_model", model="ab_fused_fp32")
    first = infer(server, "http", "ab").as_numpy("probabilities")
    second = infer(server, "grpc", "ab").as_numpy("probabilities")
    np.testing.assert_array_equal(first, second)
    assert metric(server, "nv_cache_num_hits_per_model", model="ab_fused_fp32") >= hits + 1
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    assert re.search(r"^nv_cache_num_entries", text, re.M), "cache metrics missing"
    # entries are per version: the same input to v1 and v2 gives each version's own answer
    v1 = infer(server, "http", "ab_bls", parameters={"version": 1}).as_numpy("probabilities")
    v2 = infer(server, "http", "ab_bls", parameters={"version": 2}).as_numpy("probabilities")
    assert not np.allclose(v1, v2)


def test_x_model_version_header_pins_the_version_over_http(server: EmbeddedServer) -> None:
    for n in (1, 2):
        result = infer(server, "http", "ab_bls", headers={"X-Model-Version": str(n)})
        assert result.as_numpy("model_version").reshape(-1).tolist() == [n] * len(TEXTS)
    with pytest.raises(InferenceServerException, match="X-Model-Version must be"):
        infer(server, "http", "ab_bls", headers={"X-Model-Version": "latest"})


def test_canary_switch_under_load_loses_nothing(server: EmbeddedServer) -> None:
    """Move all unpinned traffic to version 2 (a config change reloaded with explicit model
    control) while clients keep calling the BLS: no request fails, and afterwards v2 answers."""
    path = server.settings.model_repository / "ab_bls" / "config.pbtxt"
    before = path.read_text()
    load = Load(server.grpc_url, "ab_bls", workers=3).start()
    try:
        load.wait_for(10)
        path.write_text(before.replace('string_value: "1=30,2=70"', 'string_value: "1=0,2=100"'))
        assert path.read_text() != before
        server.load_model("ab_bls")
        load.wait_for(len(load.outcomes) + 10)
    finally:
        load.stop()
        path.write_text(before)
    assert load.outcomes and not load.failures, load.failures[:3]
    versions = {
        int(
            infer(server, "grpc", "ab_bls", request_id=f"after-{i}").as_numpy("model_version")[0][0]
        )
        for i in range(10)
    }
    assert versions == {2}
    server.load_model("ab_bls")  # back to the spec's split for any later test


def test_the_demo_compares_the_same_version_and_shows_the_split(
    server: EmbeddedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """The ensemble answers with the latest version: the demo pins the BLS to it (unpinned, the
    canary split would put some texts on version 1), then shows the split on its own line."""
    from tritonforge.runtime.cli import demo
    from tritonforge.tasks.classification.client import CANARY_REQUESTS

    with demo.demo_client(server, "http") as c:
        pipeline = c.pipelines()["ab"]
    assert pipeline.versions == (1, 2) and pipeline.version_weights == dict(WEIGHTS)
    demo.show(server, pipeline)
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "ab_bls over gRPC" in x)
    assert "both at version 2" in line and "3/3 labels agree" in line
    gap = float(line.rsplit("= ", 1)[1])
    assert gap < 1e-5  # the same weights on both sides
    split = next(x for x in out.splitlines() if "unpinned (canary split)" in x)
    counts = [int(n) for n in re.findall(r"v\d (\d+)/20", split)]
    assert len(counts) == 2 and sum(counts) == CANARY_REQUESTS and min(counts) > 0
