"""The fused first step against the chain it replaces, on the real embedded Triton serving the tiny
DistilBERT embedder and RoBERTa classifier (conftest.py's ``byo_server``): each ensemble's one
fused step must answer what its tokenizer -> encoder (-> postprocess) models answer when called
one after the other, and what the BLS answers, text by text, alone and batched, over gRPC. Fails
if the fused path drifts (tokenization, padding, batching, session options, postprocess)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype

from tritonforge.pipelines import from_repository
from tritonforge.repository import load_model_config, parse_targets
from tritonforge.runtime.serving import EmbeddedServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TEXTS = [
    "bad",
    "The service answered every request in time.",
    "I really did not like it, not one bit, and I will say so to anyone who asks me about it!",
    "ok then",
    " ".join(["word"] * 50),
]


def infer(
    client: grpcclient.InferenceServerClient,
    model: str,
    tensors: dict[str, np.ndarray],
    outputs: list[str],
    parameters: dict[str, object] | None = None,
) -> dict[str, np.ndarray]:
    inputs = []
    for name, value in tensors.items():
        tensor = grpcclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    result = client.infer(
        model,
        inputs,
        outputs=[grpcclient.InferRequestedOutput(n) for n in outputs],
        parameters=parameters,
    )
    return {n: result.as_numpy(n) for n in outputs}


def chain(
    client: grpcclient.InferenceServerClient, repo: Path, fused: str, texts: np.ndarray
) -> dict[str, np.ndarray]:
    """What the unfused ensemble computed: the stages the fused model's config names, in turn."""
    config = load_model_config(repo, fused)
    tokenizer = load_model_config(repo, config.parameters["tokenizer_model"])
    [encoder_name] = parse_targets(config.parameters["encoder_models"]).values()
    encoder = load_model_config(repo, encoder_name)
    tokens = infer(
        client,
        tokenizer.name,
        {tokenizer.inputs[0].name: texts},
        [t.name for t in tokenizer.outputs],
    )
    output = encoder.outputs[0].name
    [answer] = infer(client, encoder.name, tokens, [output]).values()
    if "postprocess_model" not in config.parameters:
        return {config.outputs[0].name: answer}
    post = load_model_config(repo, config.parameters["postprocess_model"])
    return infer(client, post.name, {post.inputs[0].name: answer}, [o.name for o in post.outputs])


@pytest.mark.parametrize("pipeline", ["distil", "sentiment"])
def test_the_fused_ensemble_answers_what_its_stages_and_the_bls_answer(
    byo_server: EmbeddedServer, byo_repository: Path, pipeline: str
) -> None:
    found = from_repository(byo_repository)[pipeline]
    ensemble = found.ensembles["fp32"]
    [step] = load_model_config(byo_repository, ensemble).raw["ensemble_scheduling"]["step"]
    fused = str(step["model_name"])
    assert load_model_config(byo_repository, fused).parameters["tritonforge.role"] == "fused"
    outputs = [o.name for o in found.outputs]
    client = grpcclient.InferenceServerClient(byo_server.grpc_url)
    batch = np.array([[t.encode()] for t in TEXTS], dtype=object)
    want = chain(client, byo_repository, fused, batch)
    got = infer(client, ensemble, {found.input: batch}, outputs)
    assert found.bls is not None
    bls = infer(client, found.bls, {found.input: batch}, outputs, {"variant": "fp32"})
    numeric = [n for n in outputs if want[n].dtype != object]
    for name in outputs:
        for other, label in ((got, "fused"), (bls, "bls")):
            if name in numeric:
                np.testing.assert_allclose(other[name], want[name], atol=1e-6, err_msg=label)
            else:
                assert other[name].tolist() == want[name].tolist(), (label, name)

    # alone and concurrently (the fused model's batcher merges any requests; its runner
    # must still answer each as its own shape's encoder call does)
    def one(i: int) -> dict[str, np.ndarray]:
        return infer(client, ensemble, {found.input: batch[i : i + 1]}, numeric)

    with ThreadPoolExecutor(len(TEXTS)) as pool:
        alone = list(pool.map(one, range(len(TEXTS))))
    for i, answer in enumerate(alone):
        single = chain(client, byo_repository, fused, batch[i : i + 1])
        for name in numeric:
            np.testing.assert_allclose(answer[name], single[name], atol=1e-6, err_msg=str(i))
