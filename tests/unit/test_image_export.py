"""Export of an image classifier (tritonforge/tasks/image/export/graph.py): a user's own small
CNN with BatchNorm and adaptive pooling exports in one call with dynamic batch and spatial axes,
in eval mode, verified against PyTorch; the pitfalls it exists to catch are caught; a failure
leaves the repository unchanged."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from torch import nn
from torch.nn import functional

from tritonforge.export.errors import VerificationError
from tritonforge.export.parity import ort_runner
from tritonforge.integrity import verify_sidecar
from tritonforge.tasks.image.export import graph
from tritonforge.tasks.image.export.graph import (
    INPUT,
    LABELS_FILE,
    OUTPUT,
    export_image_model,
    image_export_spec,
    training_mode_failures,
)
from tritonforge.tasks.image.preprocessing import ImagePreprocessing

SMALL = ImagePreprocessing(resize=(40,), crop=(32, 32))


class TinyCNN(nn.Module):
    """torchvision-style: conv-BN-ReLU blocks, adaptive average pooling, dropout, a linear head."""

    def __init__(self, classes: int = 5) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU6(),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Sequential(nn.Dropout(0.5), nn.Linear(16, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.pool(self.features(x)), 1))


def tiny_cnn() -> nn.Module:
    """Random weights and BatchNorm statistics far from (0, 1), left in training mode: an export
    that forgot ``eval()`` would normalise with the batch's statistics and keep dropout on."""
    torch.manual_seed(0)
    model = TinyCNN()
    for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
        bn.running_mean.uniform_(-2, 2)
        bn.running_var.uniform_(0.5, 3)
    return model.train()


class StaticPool(TinyCNN):
    """The classic mistake: a global pool whose kernel is the traced size as Python ints (the
    graph keeps 16x16; eager pools over whatever size comes)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.features(x)
        kernel = (int(y.shape[2]), int(y.shape[3]))
        return self.head(torch.flatten(functional.avg_pool2d(y, kernel_size=kernel), 1))


def static_pool() -> nn.Module:
    torch.manual_seed(0)
    return StaticPool().eval()


def test_a_small_cnn_exports_with_dynamic_axes_in_eval_mode(tmp_path: Path) -> None:
    spec = image_export_spec("tiny", tiny_cnn, 5, SMALL, sides=(24, 48, 64))
    labels = [f"class {i}" for i in range(5)]
    result = export_image_model(
        spec, tmp_path / "repo", "tiny", labels=labels, torchscript_model="tiny_torchscript"
    )
    path = tmp_path / "repo" / "tiny" / "1" / "model.onnx"
    traced = tmp_path / "repo" / "tiny_torchscript" / "1" / "model.pt"
    assert result.path == path and verify_sidecar(path, required=True)
    assert result.dynamic_axes == {
        f"{INPUT}[0]": "batch_size",
        f"{INPUT}[2]": "height",
        f"{INPUT}[3]": "width",
    }
    assert result.batchnorm_nodes == 0  # folded into the convolutions
    assert result.grid["shapes"] == 5 and not result.grid["failures"]
    assert (tmp_path / "repo" / "tiny" / LABELS_FILE).read_text().splitlines() == labels
    # the graph computes the eval-mode model on a batch and size it was not traced with
    x = np.random.default_rng(1).standard_normal((3, 3, 50, 70)).astype(np.float32)
    model = tiny_cnn().eval()
    with torch.inference_mode():
        want = model(torch.from_numpy(x)).numpy()
    got = ort_runner(path)({INPUT: x})[OUTPUT]
    assert np.allclose(got, want, atol=1e-4)
    verify_sidecar(traced, required=True)
    with torch.inference_mode():
        from_disk = torch.jit.load(str(traced))(torch.from_numpy(x)).numpy()
    assert np.allclose(from_disk, want, atol=1e-4)


def test_a_fixed_size_export_keeps_height_and_width_static(tmp_path: Path) -> None:
    spec = image_export_spec("tiny", tiny_cnn, 5, SMALL, dynamic_spatial=False)
    export_image_model(spec, tmp_path, "tiny")
    dims = onnx.load(str(tmp_path / "tiny" / "1" / "model.onnx")).graph.input[0].type
    shape = [d.dim_param or d.dim_value for d in dims.tensor_type.shape.dim]
    assert shape == ["batch_size", 3, 32, 32]


def test_a_pooling_kernel_baked_from_the_traced_size_fails_and_writes_nothing(
    tmp_path: Path,
) -> None:
    spec = image_export_spec("static", static_pool, 5, SMALL, sides=(48,))
    with pytest.raises(VerificationError, match=r"batch=2 seq=48: output 'logits'") as info:
        export_image_model(spec, tmp_path / "repo", "static")
    assert "left unchanged" in str(info.value)
    assert not (tmp_path / "repo" / "static").exists()


def test_a_graph_left_in_training_mode_is_named(tmp_path: Path) -> None:
    x = torch.zeros(2, 3, 8, 8)
    path = tmp_path / "train.onnx"
    torch.onnx.export(
        nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)).train(),
        (x,),
        str(path),
        training=torch.onnx.TrainingMode.TRAINING,
        do_constant_folding=False,
        dynamo=False,
    )
    assert any("training mode" in f for f in training_mode_failures(path))


def test_wrong_label_count_is_refused(tmp_path: Path) -> None:
    spec = image_export_spec("tiny", tiny_cnn, 5, SMALL, dynamic_spatial=False)
    with pytest.raises(VerificationError, match="3 labels for 5 classes"):
        export_image_model(spec, tmp_path, "tiny", labels=["a", "b", "c"])
    assert not (tmp_path / "tiny").exists()


def test_one_command_exports_a_users_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "user_models", sys.modules[__name__])
    argv = [
        "--module", f"{__name__}:tiny_cnn", "--classes", "5", "--name", "mine",
        "--model-repository", str(tmp_path), "--preprocessing", '{"resize": [40], "crop": [32, 32]}',
    ]  # fmt: skip
    assert graph.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["dynamic_axes"][f"{INPUT}[2]"] == "height"
    assert (tmp_path / "mine" / "1" / "model.onnx").is_file()
    assert graph.main([*argv[:1], "no_such_module:f", *argv[2:]]) == 1
    assert "cannot be loaded" in capsys.readouterr().err
