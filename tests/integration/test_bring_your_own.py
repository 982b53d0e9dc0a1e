"""Bring your own checkpoint: two architectures other than BERT, one call each, served == PyTorch.

Tiny random-initialised DistilBERT (embeddings) and RoBERTa (a 3-class classifier) checkpoints
are written with ``save_pretrained`` under ``tmp_path``, exported side by side into one temporary
repository through the same path as the default model (``pipeline_from_pretrained`` +
``export_pipeline``: grid, padded batches, TorchScript, generated configs), served on the real
embedded Triton, and called over HTTP and gRPC through every ensemble and the BLS.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests import tiny_checkpoints
from tritonforge.pipelines import Pipeline, from_repository
from tritonforge.runtime.serving import EmbeddedServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TEXTS = [
    "The service answered every request in time.",
    "bad",
    "Ünïcödé and emoji 🚀 are tokenized too, and this sentence is a good deal longer than the rest.",
    "I really did not like the slow responses!",
]
MAX_ABS = 1e-4


def reference(directory: Path, task: str, texts: list[str]) -> np.ndarray:
    """transformers itself, one unpadded text at a time (AutoTokenizer, truncation at 64)."""
    import torch
    from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    cls = AutoModelForSequenceClassification if task == "classification" else AutoModel
    model = cls.from_pretrained(str(directory)).eval()
    rows = []
    with torch.inference_mode():
        for text in texts:
            enc = tokenizer(text, truncation=True, max_length=64, return_tensors="pt")
            out = model(**enc)
            if task == "classification":
                rows.append(torch.softmax(out.logits, -1)[0].numpy())
            else:
                rows.append(out.last_hidden_state[0].mean(0).numpy())
    return np.stack(rows)


def infer(server: EmbeddedServer, protocol: str, model: str, outputs: list[str], **kw: Any) -> Any:
    data = np.array([t.encode() for t in TEXTS], dtype=np.object_).reshape(-1, 1)
    lib: Any = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    with lib.InferenceServerClient(url) as client:
        tensor = lib.InferInput("text", list(data.shape), "BYTES")
        tensor.set_data_from_numpy(data)
        result = client.infer(model, [tensor], **kw)
        return {name: result.as_numpy(name) for name in outputs}


# The export and the server are shared session fixtures (conftest.py): byo_repository, byo_server.


@pytest.fixture
def repository(byo_repository: Path) -> Path:
    return byo_repository


@pytest.fixture
def server(byo_server: EmbeddedServer) -> EmbeddedServer:
    return byo_server


def test_export_generates_every_model_under_its_own_names(repository: Path) -> None:
    pipelines = from_repository(repository)
    assert sorted(pipelines) == ["distil", "sentiment"]
    distil, sentiment = pipelines["distil"], pipelines["sentiment"]
    assert distil.task == "embedding" and distil.dim == 32
    assert distil.variants == ("fp32", "torchscript")  # int8 not asked for
    assert sentiment.labels == tiny_checkpoints.LABELS
    # two vocabularies, two tokenizers: nothing is shared between the pipelines
    assert not set(distil.models) & set(sentiment.models)
    assert "distil_tokenizer" in distil.models and "sentiment_tokenizer" in sentiment.models
    from tritonforge.runtime.launcher.lint import lint_repository

    assert lint_repository(repository) == []


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_served_embeddings_equal_pytorch(
    server: EmbeddedServer,
    repository: Path,
    byo_checkpoints: dict[str, tuple[Path, str]],
    protocol: str,
) -> None:
    pipeline: Pipeline = from_repository(repository)["distil"]
    expected = reference(*byo_checkpoints["distil"], TEXTS)
    models = [*pipeline.ensembles.values(), pipeline.model(bls=True)]
    for model in models:
        got = infer(server, protocol, model, ["embedding"])["embedding"]
        np.testing.assert_allclose(got, expected, atol=MAX_ABS, err_msg=model)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_served_probabilities_equal_pytorch(
    server: EmbeddedServer,
    repository: Path,
    byo_checkpoints: dict[str, tuple[Path, str]],
    protocol: str,
) -> None:
    pipeline = from_repository(repository)["sentiment"]
    expected = reference(*byo_checkpoints["sentiment"], TEXTS)
    names = ["label", "score", "probabilities", "top_labels", "top_scores"]
    for model in [*pipeline.ensembles.values(), pipeline.model(bls=True)]:
        got = infer(server, protocol, model, names)
        np.testing.assert_allclose(got["probabilities"], expected, atol=MAX_ABS, err_msg=model)
        labels = [pipeline.labels[i] for i in expected.argmax(1)]
        assert [x.decode() for x in got["label"].reshape(-1)] == labels, model
        np.testing.assert_allclose(got["score"].reshape(-1), expected.max(1), atol=MAX_ABS)
        assert got["top_labels"].shape == (len(TEXTS), 3)


def test_bls_top_k_per_request_and_classification_extension(server: EmbeddedServer) -> None:
    got = infer(
        server, "grpc", "sentiment_bls", ["top_labels", "top_scores"], parameters={"top_k": 1}
    )
    assert got["top_labels"].shape == (len(TEXTS), 1)
    # Triton's classification extension: class_count on the probabilities output
    data = np.array([t.encode() for t in TEXTS], dtype=np.object_).reshape(-1, 1)
    with httpclient.InferenceServerClient(server.http_url) as client:
        tensor = httpclient.InferInput("text", list(data.shape), "BYTES")
        tensor.set_data_from_numpy(data)
        out = httpclient.InferRequestedOutput("probabilities", class_count=2)
        result = client.infer("sentiment", [tensor], outputs=[out]).as_numpy("probabilities")
    score, index, label = result[0][0].decode().split(":")
    assert label in tiny_checkpoints.LABELS and int(index) == tiny_checkpoints.LABELS.index(label)
    assert 0.0 < float(score) <= 1.0


def test_bad_top_k_is_invalid_argument(server: EmbeddedServer) -> None:
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException, match="top_k") as err:
        infer(server, "http", "sentiment_bls", ["label"], parameters={"top_k": 9})
    assert "out of range" in str(err.value)
