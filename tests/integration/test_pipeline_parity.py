"""End to end: raw text through the served pipeline equals an in-process PyTorch reference.

One session server (``pipeline_server``) serves the real model repository. Every ensemble and
every ``embed_bls`` variant is checked over HTTP and gRPC on tests/data/parity_sentences.txt
(single words, texts longer than max_length, non-ASCII, emoji). The reference tokenizes each
sentence alone (no padding) with the same tokenizer.json, runs the export's PyTorch module and
L2-normalises in torch, so batching, padding, splitting and IPC on the server are all under test.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import PIPELINE_REPOSITORY
from tritonforge.modelconfig import ModelConfig
from tritonforge.runtime.serving import EmbeddedServer

pytestmark = pytest.mark.integration

SENTENCES_FILE = Path(__file__).resolve().parent.parent / "data" / "parity_sentences.txt"
CHUNK = 32  # sentences per request: several requests per check, each a real batch
FP32_MAX_ABS = 1e-4
INT8_MEAN_COSINE = 0.99

# (model, request parameters, kind) for every way the pipeline is served
ROUTES = [
    ("embed", None, "fp32"),
    ("embed_torchscript", None, "fp32"),
    ("embed_int8", None, "int8"),
    ("embed_bls", None, "fp32"),
    ("embed_bls", {"variant": "fp32"}, "fp32"),
    ("embed_bls", {"variant": "torchscript"}, "fp32"),
    ("embed_bls", {"variant": "int8"}, "int8"),
]


def load_sentences() -> list[str]:
    lines = SENTENCES_FILE.read_text(encoding="utf-8").split("\n")
    return [line for line in lines if line]


SENTENCES = load_sentences()


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    """Unit embeddings from the export's PyTorch module, one unpadded sentence at a time."""
    import torch
    from tokenizers import Tokenizer

    from tritonforge.export.specs import get_spec

    spec = get_spec("minilm")
    module = spec.build_module().eval()
    tokenizer_cfg = ModelConfig.from_pbtxt(
        (PIPELINE_REPOSITORY / "tokenizer" / "config.pbtxt").read_text()
    )
    assert tokenizer_cfg.param("max_length", kind=int) == spec.max_length
    tokenizer = Tokenizer.from_file(
        str(PIPELINE_REPOSITORY / "tokenizer" / "1" / tokenizer_cfg.param("tokenizer_file"))
    )
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=spec.max_length)
    rows = []
    with torch.inference_mode():
        for text in SENTENCES:
            enc = tokenizer.encode(text)
            ids, mask, types = (
                torch.tensor([x], dtype=torch.int64)
                for x in (enc.ids, enc.attention_mask, enc.type_ids)
            )
            pooled = module(ids, mask, types)
            rows.append(torch.nn.functional.normalize(pooled, dim=-1)[0].numpy())
    return np.stack(rows)


def _batch(texts: Sequence[str | bytes]) -> np.ndarray:
    data = [t.encode("utf-8") if isinstance(t, str) else t for t in texts]
    return np.array(data, dtype=np.object_).reshape(-1, 1)


def infer_http(
    server: EmbeddedServer, model: str, texts: Sequence[str | bytes], params: Any = None
) -> np.ndarray:
    data = _batch(texts)
    with httpclient.InferenceServerClient(server.http_url, network_timeout=120) as client:
        tensor = httpclient.InferInput("text", list(data.shape), "BYTES")
        tensor.set_data_from_numpy(data)
        return np.asarray(client.infer(model, [tensor], parameters=params).as_numpy("embedding"))


def infer_grpc(
    server: EmbeddedServer, model: str, texts: Sequence[str | bytes], params: Any = None
) -> np.ndarray:
    data = _batch(texts)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        tensor = grpcclient.InferInput("text", list(data.shape), "BYTES")
        tensor.set_data_from_numpy(data)
        result = client.infer(model, [tensor], parameters=params, client_timeout=120)
        return np.asarray(result.as_numpy("embedding"))


PROTOCOLS: dict[str, Callable[..., np.ndarray]] = {"http": infer_http, "grpc": infer_grpc}


def embed_all(server: EmbeddedServer, protocol: str, model: str, params: Any) -> np.ndarray:
    """All sentences, CHUNK per request, the requests in flight together (so they batch)."""
    infer = PROTOCOLS[protocol]
    chunks = [SENTENCES[i : i + CHUNK] for i in range(0, len(SENTENCES), CHUNK)]
    with concurrent.futures.ThreadPoolExecutor(len(chunks)) as pool:
        parts = pool.map(lambda c: infer(server, model, c, params), chunks)
        return np.concatenate(list(parts))


def test_sentence_file_covers_the_cases() -> None:
    assert len(SENTENCES) >= 100
    assert any(len(s.split()) == 1 and s.isascii() for s in SENTENCES)
    assert any(len(s.split()) > 300 for s in SENTENCES)  # longer than max_length tokens
    assert any(not s.isascii() for s in SENTENCES)
    assert any(ord(c) >= 0x1F300 for s in SENTENCES for c in s)  # emoji


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
@pytest.mark.parametrize(
    ("model", "params", "kind"),
    ROUTES,
    ids=[f"{m}-{(p or {}).get('variant', 'default')}" for m, p, _ in ROUTES],
)
def test_served_embeddings_equal_pytorch(
    pipeline_server: EmbeddedServer,
    reference: np.ndarray,
    protocol: str,
    model: str,
    params: dict[str, str] | None,
    kind: str,
) -> None:
    served = embed_all(pipeline_server, protocol, model, params)
    assert served.shape == reference.shape
    assert served.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(served, axis=1), 1.0, atol=1e-5)
    if kind == "fp32":
        worst = np.abs(served - reference).max(axis=1)
        assert worst.max() <= FP32_MAX_ABS, (
            f"{model} {params} over {protocol}: max abs error {worst.max():.2e} on "
            f"{SENTENCES[int(worst.argmax())]!r}"
        )
    else:
        cosines = (served * reference).sum(axis=1)
        assert cosines.mean() >= INT8_MEAN_COSINE, (
            f"{model} {params} over {protocol}: mean cosine {cosines.mean():.4f}, worst "
            f"{cosines.min():.4f} on {SENTENCES[int(cosines.argmin())]!r}"
        )


def _status(e: InferenceServerException) -> str:
    return str(e.status())


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
@pytest.mark.parametrize("model", ["embed", "embed_bls"])
@pytest.mark.parametrize(
    ("texts", "message"),
    [
        (["fine", "  \t "], "input 'text' item 1 is empty or whitespace-only"),
        ([""], "input 'text' item 0 is empty"),
        ([b"ok", b"\xff\xfe bad"], "input 'text' item 1 is not valid UTF-8"),
        (["x" * 20000], "input 'text' item 0 is 20000 bytes"),
    ],
    ids=["whitespace", "empty", "non-utf8", "too-long"],
)
def test_bad_input_is_invalid_arg_and_server_keeps_serving(
    pipeline_server: EmbeddedServer,
    protocol: str,
    model: str,
    texts: list[str | bytes],
    message: str,
) -> None:
    before = pipeline_server.stub_pids()
    with pytest.raises(InferenceServerException) as info:
        PROTOCOLS[protocol](pipeline_server, model, texts)
    assert _status(info.value) in ("400", "StatusCode.INVALID_ARGUMENT")
    assert message in info.value.message()
    assert "Traceback" not in info.value.message()
    assert pipeline_server.stub_pids() == before
    assert infer_http(pipeline_server, model, ["still serving"]).shape == (1, 384)


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_unknown_variant_is_invalid_arg(pipeline_server: EmbeddedServer, protocol: str) -> None:
    with pytest.raises(InferenceServerException) as info:
        PROTOCOLS[protocol](pipeline_server, "embed_bls", ["fine"], {"variant": "fp16"})
    assert _status(info.value) in ("400", "StatusCode.INVALID_ARGUMENT")
    assert "'variant'='fp16' is unknown; use one of ['fp32', 'int8', 'torchscript']" in (
        info.value.message()
    )


def test_one_bad_request_fails_alone(
    pipeline_server: EmbeddedServer, reference: np.ndarray
) -> None:
    """Concurrent requests to embed_bls (batched together by Triton): only the bad one fails."""
    good = [SENTENCES[i : i + 4] for i in range(0, 24, 4)]
    jobs: list[list[str | bytes]] = [*good[:3], [" "], *good[3:]]
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        futures = [pool.submit(infer_grpc, pipeline_server, "embed_bls", j) for j in jobs]
    with pytest.raises(InferenceServerException, match="whitespace-only"):
        futures[3].result()
    outputs = [f.result() for i, f in enumerate(futures) if i != 3]
    np.testing.assert_allclose(np.concatenate(outputs), reference[:24], atol=FP32_MAX_ABS)


def test_unavailable_stage_is_named(serve: Callable[..., EmbeddedServer]) -> None:
    """With encoder_int8 not loaded, the int8 variant answers UNAVAILABLE naming that stage; the
    default variant keeps working."""
    server = serve(
        PIPELINE_REPOSITORY,
        model_control_mode="explicit",
        load_models=["tokenizer", "encoder_fp32", "embed_bls"],
    )
    for protocol, status in [("http", "503"), ("grpc", "StatusCode.UNAVAILABLE")]:
        with pytest.raises(InferenceServerException) as info:
            PROTOCOLS[protocol](server, "embed_bls", ["hello"], {"variant": "int8"})
        assert _status(info.value) == status
        assert "stage 'encoder_int8'" in info.value.message()
        assert infer_http(server, "embed_bls", ["hello"]).shape == (1, 384)
