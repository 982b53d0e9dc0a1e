"""A CPU-target export's int8 GPU config (the dynamic graph kept on the host CPU) is what the real
Triton loads and serves under ``--model-config-name=gpu``, the NVIDIA container's flag."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ServeFn
from tests.unit.test_quantize_targets import int8_spec
from tritonforge.export.encoder import Options, run_export
from tritonforge.export.parity import ort_runner
from tritonforge.modelconfig import pbtxt_to_dict

pytestmark = pytest.mark.integration


def test_dynamic_int8_gpu_config_loads_and_answers_on_the_cpu(
    tmp_path: Path, serve: ServeFn
) -> None:
    import tritonclient.http as http

    exported = tmp_path / "exported"
    run_export(
        int8_spec(),
        Options(repo=exported, formats=("onnx",), quantize="int8"),
        progress=lambda _: None,
    )
    repo = tmp_path / "repo"
    model = repo / "tiny8_int8"
    model.parent.mkdir()
    (exported / "tiny8_int8").rename(model)
    # Only configs/gpu.pbtxt: Triton loading the model proves it read the GPU config.
    (model / "config.pbtxt").unlink()
    server = serve(repo, extra_args=["--model-config-name=gpu"], restrict_apis=False)
    client = http.InferenceServerClient(server.http_url)
    loaded = client.get_model_config("tiny8_int8")
    want = pbtxt_to_dict((model / "configs" / "gpu.pbtxt").read_text())
    assert {g["kind"] for g in loaded["instance_group"]} == {"KIND_CPU"}
    assert loaded["default_model_filename"] == want["default_model_filename"] == "model.onnx"
    x = np.random.default_rng(5).standard_normal((2, 5, 4)).astype(np.float32)
    tensor = http.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    got = client.infer("tiny8_int8", [tensor]).as_numpy("y")
    # row by row: the served int8 encoder answers each row as if alone (batch-invariant int8)
    runner = ort_runner(model / "1" / "model.onnx")
    expected = np.concatenate([runner({"x": x[i : i + 1]})["y"] for i in range(len(x))])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
