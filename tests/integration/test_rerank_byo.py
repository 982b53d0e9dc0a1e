"""A user's own cross-encoder through the CLI: ``--from-pretrained DIR --task rerank`` (a tiny
random one-label BERT, checked against PyTorch) and ``--from-onnx DIR --task rerank`` (its
ONNX), each served as NAME on the real embedded Triton and equal to ONNX Runtime in-process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.tiny_checkpoints import bert_cross_encoder
from tritonforge.cli import main as tritonforge_main
from tritonforge.runtime.launcher.lint import lint_repository
from tritonforge.runtime.launcher.settings import ServerSettings
from tritonforge.runtime.serving import EmbeddedServer
from tritonforge.tasks.rerank.export import OrtReranker, export_pretrained
from tritonforge.tasks.rerank.export.run import user_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUERY = "where are requests merged into batches?"
DOCUMENTS = ["The batcher merges requests.", "It rains.", "Queues hold requests until a batch."]


def scores(server: EmbeddedServer, model: str) -> np.ndarray:
    with httpclient.InferenceServerClient(server.http_url) as client:
        inputs = []
        for name, values in (("query", [QUERY]), ("documents", DOCUMENTS)):
            data = np.array([v.encode() for v in values], dtype=np.object_)
            t = httpclient.InferInput(name, [len(values)], "BYTES")
            t.set_data_from_numpy(data)
            inputs.append(t)
        return np.asarray(client.infer(model, inputs).as_numpy("logits"))


def test_from_pretrained_and_from_onnx_serve_a_users_cross_encoder(tmp_path: Path) -> None:
    checkpoint = bert_cross_encoder(tmp_path / "checkpoint")
    onnx_dir = export_pretrained(checkpoint, tmp_path / "onnx")
    repo = tmp_path / "model_repository"
    base = ["export", "--model-repository", str(repo), "--task", "rerank"]
    assert tritonforge_main([*base, "--from-pretrained", str(checkpoint), "--name", "mine"]) == 0
    assert tritonforge_main([*base, "--from-onnx", str(onnx_dir), "--name", "theirs"]) == 0
    assert lint_repository(repo) == []
    want, _ = OrtReranker(onnx_dir, user_spec("x", onnx_dir)).logits(QUERY, DOCUMENTS)
    with EmbeddedServer(ServerSettings.ephemeral(repo)) as server:
        for model in ("mine", "mine_bls", "theirs", "theirs_bls"):
            np.testing.assert_allclose(scores(server, model), np.reshape(want, -1), atol=1e-5)


def test_from_onnx_refuses_a_directory_without_a_graph(tmp_path: Path) -> None:
    repo = tmp_path / "model_repository"
    argv = ["export", "--model-repository", str(repo), "--task", "rerank", "--from-onnx"]
    assert tritonforge_main([*argv, str(tmp_path), "--name", "x"]) == 1
    assert not repo.exists() or not any(repo.iterdir())
