"""The image task's Triton Python models run in-process over a stand-in of the stub's
``triton_python_backend_utils`` (the real stub runs them once the registry wires the task), and
the whole chain in-process: preprocess stage -> the exported EfficientNet-Lite0 in ONNX Runtime
-> postprocess stage, against PyTorch on the torchvision reference, on every sample photo."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from tritonforge.classify import softmax
from tritonforge.export.parity import ort_runner
from tritonforge.tasks.image.export.graph import (
    INPUT,
    LABELS_FILE,
    OUTPUT,
    efficientnet_lite0,
    export_image_model,
    image_export_spec,
)
from tritonforge.tasks.image.preprocessing import EFFICIENTNET_LITE
from tritonforge.tasks.image.reference import reference_pixels
from tritonforge.tasks.image.samples import imagenet_labels, sample_photos

STAGES = Path(__file__).resolve().parents[2] / "tritonforge" / "tasks" / "image" / "stages"


class Tensor:
    def __init__(self, name: str, value: np.ndarray) -> None:
        self._name, self._value = name, value

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._value


class TritonError:
    INVALID_ARG, UNAVAILABLE, INTERNAL = "INVALID_ARG", "UNAVAILABLE", "INTERNAL"

    def __init__(self, message: str, code: str = "INTERNAL") -> None:
        self.message_, self.code_ = message, code


class Response:
    def __init__(self, output_tensors: list[Tensor] | None = None, error: Any = None) -> None:
        self.tensors = {t.name(): t.as_numpy() for t in output_tensors or []}
        self.error = error


class Request:
    def __init__(self, inputs: dict[str, np.ndarray], parameters: str = "{}") -> None:
        self.inputs, self._parameters = inputs, parameters

    def parameters(self) -> str:
        return self._parameters


def stub() -> ModuleType:
    module = ModuleType("triton_python_backend_utils")
    module.Tensor, module.TritonError, module.InferenceResponse = Tensor, TritonError, Response  # type: ignore[attr-defined]
    module.get_input_tensor_by_name = lambda request, name: (  # type: ignore[attr-defined]
        Tensor(name, request.inputs[name]) if name in request.inputs else None
    )
    return module


@pytest.fixture
def pb_utils(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    module = stub()
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", module)
    yield module


def load_stage(name: str, config: dict[str, Any], repo: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"image_stage_{name}", STAGES / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.TritonPythonModel()
    model.initialize({"model_config": json.dumps(config), "model_repository": str(repo)})
    return model


def preprocess_config(max_batch: int = 8) -> dict[str, Any]:
    return {
        "name": "image_preprocess",
        "max_batch_size": max_batch,
        "input": [{"name": "image", "data_type": "TYPE_STRING", "dims": [1]}],
        "output": [
            {
                "name": INPUT,
                "data_type": "TYPE_FP32",
                "dims": list(EFFICIENTNET_LITE.output_shape()),
            }
        ],
        "parameters": {
            k: {"string_value": v} for k, v in EFFICIENTNET_LITE.to_parameters().items()
        },
    }


def postprocess_config() -> dict[str, Any]:
    return {
        "name": "image_postprocess",
        "max_batch_size": 8,
        "input": [{"name": OUTPUT, "data_type": "TYPE_FP32", "dims": [1000]}],
        "output": [
            {"name": "label", "data_type": "TYPE_STRING", "dims": [1]},
            {"name": "score", "data_type": "TYPE_FP32", "dims": [1]},
            {
                "name": "probabilities",
                "data_type": "TYPE_FP32",
                "dims": [1000],
                "label_filename": LABELS_FILE,
            },
            {"name": "top_labels", "data_type": "TYPE_STRING", "dims": [-1]},
            {"name": "top_scores", "data_type": "TYPE_FP32", "dims": [-1]},
        ],
        "parameters": {"top_k": {"string_value": "5"}},
    }


def images(*items: bytes) -> np.ndarray:
    return np.array([[x] for x in items], dtype=object)


def png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def test_preprocess_answers_each_request_and_names_the_bad_items(
    pb_utils: ModuleType, tmp_path: Path
) -> None:
    model = load_stage("preprocess_model", preprocess_config(), tmp_path)
    good = png(Image.new("RGB", (300, 200), (10, 200, 30)))
    responses = model.execute(
        [
            Request({"image": images(good, good)}),
            Request({"image": images(good, b"", b"%PDF")}),
            Request({}),
            Request({"image": images(*[good] * 9)}),
            Request({"image": images(good)}),
        ]
    )
    assert responses[0].error is None and responses[0].tensors[INPUT].shape == (2, 3, 224, 224)
    assert responses[1].error.code_ == "INVALID_ARG"
    assert "2 of 3 image(s) refused: image[1]: 0 bytes" in responses[1].error.message_
    assert "image[2]: not an image" in responses[1].error.message_
    assert "'image' is required" in responses[2].error.message_
    assert "9 images, at most 8" in responses[3].error.message_
    assert np.array_equal(responses[4].tensors[INPUT][0], responses[0].tensors[INPUT][1])


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("repo")
    spec = image_export_spec("efficientnet_lite0", efficientnet_lite0, 1000)
    export_image_model(spec, repo, "efficientnet_lite0", labels=imagenet_labels())
    return repo / "efficientnet_lite0"


def test_the_chain_equals_pytorch_on_the_torchvision_reference(
    pb_utils: ModuleType, exported: Path
) -> None:
    """Issue #32's bar, in-process: top-5 labels equal and probabilities within 1e-4 on every
    sample photo, one at a time and as one batch."""
    pre = load_stage("preprocess_model", preprocess_config(16), exported)
    post = load_stage("postprocess_model", postprocess_config(), exported)
    onnx = ort_runner(exported / "1" / "model.onnx")
    photos = sample_photos()
    labels = imagenet_labels()
    model = efficientnet_lite0()
    reference = np.stack([reference_pixels(p, EFFICIENTNET_LITE) for p in photos.values()])
    with torch.inference_mode():
        want = softmax(model(torch.from_numpy(reference)).numpy())
    want_top5 = [[labels[i] for i in np.argsort(-row, kind="stable")[:5]] for row in want]

    def serve(items: list[bytes]) -> Response:
        (pixels,) = pre.execute([Request({"image": images(*items)})])
        logits = onnx({INPUT: pixels.tensors[INPUT]})[OUTPUT]
        (answer,) = post.execute([Request({OUTPUT: logits})])
        return answer

    data = [p.read_bytes() for p in photos.values()]
    batch = serve(data)
    for i, name in enumerate(photos):
        alone = serve([data[i]])
        for answer, row in ((alone, 0), (batch, i)):
            got = [x.decode() for x in answer.tensors["top_labels"][row]]
            assert got == want_top5[i], name
            assert np.abs(answer.tensors["probabilities"][row] - want[i]).max() <= 1e-4, name
    assert batch.tensors["label"][list(photos).index("coffee"), 0] == b"espresso"


def test_postprocess_top_k_per_request(pb_utils: ModuleType, tmp_path: Path) -> None:
    (tmp_path / LABELS_FILE).write_text("\n".join(imagenet_labels()) + "\n")
    post = load_stage("postprocess_model", postprocess_config(), tmp_path)
    logits = np.zeros((2, 1000), dtype=np.float32)
    logits[:, 967] = 5.0  # espresso
    ok, asked, bad = post.execute(
        [
            Request({OUTPUT: logits}),
            Request({OUTPUT: logits}, json.dumps({"top_k": 2})),
            Request({OUTPUT: logits}, json.dumps({"top_k": 1001})),
        ]
    )
    assert ok.tensors["top_labels"].shape == (2, 5) and ok.tensors["label"][0, 0] == b"espresso"
    assert asked.tensors["top_scores"].shape == (2, 2)
    assert bad.error.code_ == "INVALID_ARG" and "'top_k'=1001 is out of range" in bad.error.message_
