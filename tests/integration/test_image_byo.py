"""A user's own torchvision-style CNN served with one command (docs/images.md):
``tritonforge export --from-pretrained DIR --task image --name tiny_cnn`` where DIR holds
``model.py`` (``build()``), ``preprocessing.json`` and ``labels.txt``. A tiny random CNN with
BatchNorm (statistics far from (0, 1), left in training mode) and adaptive pooling comes back
from the real Triton as PyTorch eval mode computes it, labels from its labels.txt."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from tritonforge.classify import softmax
from tritonforge.client import EmbeddingClient
from tritonforge.export.cli import main as export_main
from tritonforge.runtime.launcher.lint import lint_repository
from tritonforge.runtime.launcher.settings import ServerSettings
from tritonforge.runtime.serving import EmbeddedServer
from tritonforge.tasks.image.export.run import load_ref
from tritonforge.tasks.image.preprocessing import ImagePreprocessing
from tritonforge.tasks.image.samples import sample_photos
from tritonforge.tasks.image.transforms import preprocess

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL_PY = """
import torch
from torch import nn


class TinyCNN(nn.Module):
    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU6(),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Sequential(nn.Dropout(0.5), nn.Linear(16, classes))

    def forward(self, x):
        return self.head(torch.flatten(self.pool(self.features(x)), 1))


def build():
    torch.manual_seed(0)
    model = TinyCNN()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-2, 2)
            m.running_var.uniform_(0.5, 4)
    return model.train()  # left in training mode: the export must put it in eval
"""
PREPROCESSING = {"resize": [72], "crop": [64, 64], "interpolation": "bicubic"}
LABELS = ["cat", "dog", "rocket", "coffee"]


@pytest.fixture(scope="module")
def byo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("image-byo")
    source = root / "tiny_cnn"
    source.mkdir()
    (source / "model.py").write_text(MODEL_PY)
    (source / "preprocessing.json").write_text(json.dumps(PREPROCESSING))
    (source / "labels.txt").write_text("\n".join(LABELS) + "\n")
    repo = root / "model_repository"
    argv = ["--from-pretrained", str(source), "--task", "image", "--name", "tiny_cnn"]
    assert export_main([*argv, "--model-repository", str(repo)]) == 0
    assert lint_repository(repo) == []
    return source, repo


@pytest.fixture(scope="module")
def server(byo: tuple[Path, Path]) -> Iterator[EmbeddedServer]:
    with EmbeddedServer(ServerSettings.ephemeral(byo[1])) as running:
        yield running


def test_the_one_command_export_writes_the_whole_pipeline(byo: tuple[Path, Path]) -> None:
    _, repo = byo
    for model in ("tiny_cnn", "tiny_cnn_bls", "tiny_cnn_preprocess", "tiny_cnn_postprocess"):
        assert (repo / model / "config.pbtxt").is_file(), model
    assert (repo / "tiny_cnn_postprocess" / "labels.txt").read_text().split() == LABELS
    config = (repo / "tiny_cnn_preprocess" / "config.pbtxt").read_text()
    assert "bicubic" in config and "image.crop" in config


@pytest.mark.parametrize(("protocol", "route"), [("http", "ensemble"), ("grpc", "bls")])
def test_served_as_pytorch_eval_computes_it(
    byo: tuple[Path, Path], server: EmbeddedServer, protocol: str, route: str
) -> None:
    source, _ = byo
    photos = [sample_photos()[n] for n in ("chelsea", "rocket")]
    spec = ImagePreprocessing.from_parameters(
        {f"image.{k}": json.dumps(v) for k, v in PREPROCESSING.items()}
    )
    pixels = np.stack([preprocess(p.read_bytes(), spec) for p in photos])
    with torch.inference_mode():
        want = softmax(load_ref(f"{source / 'model.py'}:build")().eval()(torch.from_numpy(pixels)))
    url = server.http_url if protocol == "http" else server.grpc_url
    with EmbeddingClient(url=url, protocol=protocol, admin_key=server.settings.admin_key) as c:
        got = c.classify_image(photos, top_k=2, route=route)
    for answer, probabilities in zip(got, want, strict=True):
        np.testing.assert_allclose(answer.probabilities, probabilities, atol=1e-5)
        assert answer.label == LABELS[int(np.argmax(probabilities))]
        assert len(answer.top) == 2
