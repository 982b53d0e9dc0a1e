"""End to end: the served default classifier equals transformers, every route and version.

The session server serves the real model repository. For every registered classification
pipeline, each version's checkpoint is run by ``transformers`` itself
(``AutoModelForSequenceClassification`` + ``AutoTokenizer``, one unpadded text at a time) on
tests/data/parity_sentences.txt; the ensembles (latest version) and the BLS (each version pinned)
must give the same probabilities within 1e-4 (fp32, TorchScript) or agree on the top label for
>= 99% of the texts with no probability moving by more than the spec's gate (int8), over HTTP
and gRPC.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import PIPELINE_REPOSITORY
from tritonforge.export.pipeline_spec import PipelineSpec
from tritonforge.export.specs import get_pipeline, pipeline_names
from tritonforge.pipelines import from_repository
from tritonforge.runtime.serving import EmbeddedServer

pytestmark = pytest.mark.integration

SENTENCES = [
    line
    for line in (Path(__file__).resolve().parent.parent / "data" / "parity_sentences.txt")
    .read_text("utf-8")
    .split("\n")
    if line
]
CHUNK = 32
FP32_MAX_ABS = 1e-4


def classifiers() -> list[PipelineSpec]:
    specs = [get_pipeline(name) for name in pipeline_names()]
    return [s for s in specs if s.task == "classification"]


@cache
def reference(directory: Path, max_length: int) -> np.ndarray:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model = AutoModelForSequenceClassification.from_pretrained(str(directory)).eval()
    rows = []
    with torch.inference_mode():
        for text in SENTENCES:
            enc = tokenizer(text, truncation=True, max_length=max_length, return_tensors="pt")
            rows.append(torch.softmax(model(**enc).logits, -1)[0].numpy())
    return np.stack(rows)


def served(server: EmbeddedServer, protocol: str, model: str, params: Any) -> np.ndarray:
    lib: Any = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    parts = []
    with lib.InferenceServerClient(url) as client:
        for i in range(0, len(SENTENCES), CHUNK):
            data = np.array([t.encode() for t in SENTENCES[i : i + CHUNK]], dtype=np.object_)
            tensor = lib.InferInput("text", [len(data), 1], "BYTES")
            tensor.set_data_from_numpy(data.reshape(-1, 1))
            result = client.infer(model, [tensor], parameters=params)
            parts.append(result.as_numpy("probabilities"))
    return np.concatenate(parts)


def routes(spec: PipelineSpec) -> list[tuple[str, dict[str, Any] | None, str, int]]:
    """(model, request parameters, variant, version) for every way the pipeline is served."""
    pipeline = from_repository(PIPELINE_REPOSITORY)[spec.name]
    latest = max(v.number for v in spec.versions)
    out: list[tuple[str, dict[str, Any] | None, str, int]] = [
        (model, None, variant, latest) for variant, model in pipeline.ensembles.items()
    ]
    if pipeline.bls:
        for variant in pipeline.bls_variants:
            for v in spec.versions:
                out.append(
                    (pipeline.bls, {"variant": variant, "version": v.number}, variant, v.number)
                )
    return out


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_served_probabilities_equal_transformers(
    pipeline_server: EmbeddedServer, protocol: str
) -> None:
    specs = classifiers()
    assert specs, "no classification pipeline is registered"
    for spec in specs:
        gate = spec.encoder.quality_gate
        assert gate is not None
        directories = {v.number: v.encoder.source_files[0].parent for v in spec.versions}
        for model, params, variant, version in routes(spec):
            expected = reference(directories[version], spec.encoder.max_length)
            got = served(pipeline_server, protocol, model, params)
            where = f"{model} {params} over {protocol}"
            assert got.shape == expected.shape, where
            np.testing.assert_allclose(got.sum(1), 1.0, atol=1e-5, err_msg=where)
            if variant == "int8":
                agreement = float((got.argmax(1) == expected.argmax(1)).mean())
                assert agreement >= gate.top1_agreement_min, (where, agreement)
                assert float(np.abs(got - expected).max()) <= gate.max_prob_diff_max, where
            else:
                worst = float(np.abs(got - expected).max())
                assert worst <= FP32_MAX_ABS, (where, worst)
