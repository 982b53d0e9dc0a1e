"""Integration fixtures shared by several files."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import tiny_checkpoints
from tritonforge.runtime.launcher.settings import ServerSettings
from tritonforge.runtime.serving import EmbeddedServer


@pytest.fixture(scope="session")
def byo_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """Tiny random-initialised checkpoints (``save_pretrained``): a DistilBERT embedder
    ``distil`` and a 3-class RoBERTa classifier ``sentiment``."""
    root = tmp_path_factory.mktemp("checkpoints")
    return {
        "distil": (tiny_checkpoints.distilbert(root / "distil"), "embedding"),
        "sentiment": (
            tiny_checkpoints.roberta(root / "sentiment", tiny_checkpoints.LABELS),
            "classification",
        ),
    }


@pytest.fixture(scope="session")
def byo_repository(
    tmp_path_factory: pytest.TempPathFactory, byo_checkpoints: dict[str, tuple[Path, str]]
) -> Path:
    """Both checkpoints exported side by side into one temporary repository (fp32 +
    TorchScript; ~20 s, once per session)."""
    from tritonforge.export.encoder import Options, export_pipeline
    from tritonforge.export.specs.from_pretrained import pipeline_from_pretrained

    repo = tmp_path_factory.mktemp("byo") / "model_repository"
    for name, (directory, task) in byo_checkpoints.items():
        spec = pipeline_from_pretrained(directory, task, name, max_length=64)
        export_pipeline(spec, Options(repo=repo, quantize=None), progress=lambda _: None)
    return repo


@pytest.fixture(scope="session")
def byo_server(byo_repository: Path) -> Iterator[EmbeddedServer]:
    """The embedded Triton serving :func:`byo_repository`."""
    with EmbeddedServer(ServerSettings.ephemeral(byo_repository)) as server:
        yield server
