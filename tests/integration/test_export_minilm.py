"""The real MiniLM export served by the real embedded Triton matches PyTorch.

The export runs once per module into the project's model repository; with unchanged inputs
(``make export`` ran before) the exporter's fingerprint skip makes it a no-op.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import MODEL_REPOSITORY, ServeFn
from tritonforge.export.encoder import FORMATS, Options, run_export
from tritonforge.export.quantize import cosines
from tritonforge.export.spec import ExportSpec, Inputs
from tritonforge.export.specs import get_spec
from tritonforge.export.tritonconfig import check_repository, torchscript_names
from tritonforge.runtime.errors import ModelLoadError

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def spec() -> ExportSpec:
    return get_spec("minilm")


@pytest.fixture(scope="module")
def exported(spec: ExportSpec) -> Path:
    run_export(spec, Options(repo=MODEL_REPOSITORY, formats=FORMATS, quantize="int8"))
    return MODEL_REPOSITORY


def _copy_models(src: Path, dst: Path, names: list[str]) -> Path:
    for name in names:
        shutil.copytree(src / name, dst / name)
    return dst


def _infer(url: str, model: str, inputs: Inputs, names: dict[str, str], output: str) -> np.ndarray:
    import tritonclient.http as http

    client = http.InferenceServerClient(url)
    tensors = []
    for name, value in inputs.items():
        t = http.InferInput(names[name], list(value.shape), "INT64")
        t.set_data_from_numpy(value)
        tensors.append(t)
    result = client.infer(model, tensors, outputs=[http.InferRequestedOutput(names[output])])
    return np.asarray(result.as_numpy(names[output]))


def test_every_config_parses_and_matches_its_graph(exported: Path, spec: ExportSpec) -> None:
    configs = [*exported.glob("*/config.pbtxt"), *exported.glob("*/configs/*.pbtxt")]
    assert any(p.parent.name == "configs" for p in configs), "no configs/gpu.pbtxt written"
    assert check_repository(exported, [spec]) == []


def test_served_encoders_match_pytorch(
    exported: Path, spec: ExportSpec, serve: ServeFn, tmp_path: Path
) -> None:
    s = spec.serving
    assert s is not None and s.int8_name and s.torchscript_name and spec.evaluation
    gate = spec.quality_gate
    assert gate is not None
    repo = _copy_models(exported, tmp_path, [s.fp32_name, s.int8_name, s.torchscript_name])
    server = serve(repo)
    module = spec.build_module().eval()
    out = spec.outputs[0]
    same = {t.name: t.name for t in (*spec.inputs, *spec.outputs)}
    int8_cos = []
    # One request per evaluation batch (8 sentences, padded), sent one after the other.
    for batch in spec.evaluation():
        with torch.inference_mode():
            want = module(*(torch.from_numpy(batch[t.name]) for t in spec.inputs)).numpy()
        for model, names in (
            (s.fp32_name, same),
            (s.torchscript_name, torchscript_names(spec)),
        ):
            got = _infer(server.http_url, model, batch, names, out.name)
            np.testing.assert_allclose(got, want, atol=out.atol, rtol=out.rtol, err_msg=model)
        int8_cos.append(cosines(_infer(server.http_url, s.int8_name, batch, same, out.name), want))
    cos = np.concatenate(int8_cos)
    assert cos.mean() >= gate.mean_cosine_min, f"int8 mean cosine {cos.mean():.4f}"
    assert cos.min() >= gate.min_cosine_min, f"int8 min cosine {cos.min():.4f}"


def test_corrupted_artifact_is_refused_at_load(
    exported: Path, spec: ExportSpec, serve: ServeFn, tmp_path: Path
) -> None:
    assert spec.serving is not None
    name = spec.serving.fp32_name
    repo = _copy_models(exported, tmp_path, [name])
    model = repo / name / "1" / "model.onnx"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError) as info:
        serve(repo)
    reason = info.value.failures.get(name, "")
    assert "does not match model.onnx.sha256" in reason, info.value.failures
