"""A request's answer must not depend on who shares its batch (issue 20 item 3).

For every discovered text pipeline, every variant and route (ensembles, the BLS pinned to each
variant), the same text is sent alone, inside one request among other texts of other lengths
(so it is merged and padded with them at the encoder), and alongside concurrent requests (which
the dynamic batcher may merge); every answer must equal the lone one within 1e-6, int8 included:
dynamic int8 quantizes activations with one scale per tensor, so the ONNX Runtime backend runs
such graphs row by row (``batch_rows``, :func:`tritonforge.batching.infer_rows`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import PIPELINE_REPOSITORY
from tritonforge.pipelines import Pipeline, from_repository
from tritonforge.runtime.serving import EmbeddedServer

pytestmark = pytest.mark.integration

TEXT = "Worst flight ever."
OTHERS = (
    "I absolutely loved the service, the crew was friendly and the food was great; I would fly "
    "with them again without a second thought, even on a long overnight trip.",
    "ok",
    "The delay was announced late and nobody at the gate could tell us anything useful.",
)
MAX_ABS = 1e-6


def routes() -> list[tuple[str, str, str, dict[str, str]]]:
    """(id, pipeline, model, request parameters) of every variant of every route."""
    out = []
    for name, p in sorted(from_repository(PIPELINE_REPOSITORY).items()):
        for variant, model in p.ensembles.items():
            out.append((f"{name}-ensemble-{variant}", name, model, {}))
        for variant in p.bls_variants:
            if p.bls is not None:
                out.append((f"{name}-bls-{variant}", name, p.bls, {"variant": variant}))
    return out


ROUTES = routes()


def infer(url: str, pipeline: Pipeline, model: str, texts: list[str], params: dict) -> np.ndarray:
    """The first output (embedding / probabilities) of one request, one row per text."""
    output = pipeline.outputs[0].name if pipeline.task == "embedding" else "probabilities"
    with grpcclient.InferenceServerClient(url) as c:
        tensor = grpcclient.InferInput(pipeline.input, [len(texts), 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[t.encode()] for t in texts], np.object_))
        result: Any = c.infer(
            model, [tensor], outputs=[grpcclient.InferRequestedOutput(output)], parameters=params
        )
        return result.as_numpy(output)


@pytest.mark.parametrize(
    ("pipeline", "model", "params"), [r[1:] for r in ROUTES], ids=[r[0] for r in ROUTES]
)
def test_the_same_text_gets_the_same_answer_alone_and_in_any_batch(
    pipeline_server: EmbeddedServer, pipeline: str, model: str, params: dict[str, str]
) -> None:
    p = from_repository(PIPELINE_REPOSITORY)[pipeline]
    url = pipeline_server.grpc_url
    alone = infer(url, p, model, [TEXT], params)[0]
    inside = infer(url, p, model, [OTHERS[0], TEXT, *OTHERS[1:]], params)[1]
    assert np.abs(inside - alone).max() <= MAX_ABS, f"{model}: in a request of 4 texts"
    # Concurrent requests: the text several times among longer and shorter ones.
    batch = [[TEXT] if i % 3 == 0 else [OTHERS[i % len(OTHERS)]] for i in range(12)]
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda texts: infer(url, p, model, texts, params), batch))
    for texts, answer in zip(batch, answers, strict=True):
        if texts == [TEXT]:
            assert np.abs(answer[0] - alone).max() <= MAX_ABS, f"{model}: concurrent"


def test_every_variant_is_covered() -> None:
    """The routes above come from discovery: int8 must be among them when it is exported."""
    variants = {r[0].rsplit("-", 1)[1] for r in ROUTES}
    assert "fp32" in variants
    if any("int8" in p.ensembles for p in from_repository(PIPELINE_REPOSITORY).values()):
        assert "int8" in variants
