"""Rerank postprocess (scores) and what the stages read (tensors): pure functions."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tritonforge.errors import InvalidInputError, ModelConfigError, NumericalError
from tritonforge.modelconfig import ModelConfig
from tritonforge.tasks.rerank.protocol import RerankLimits, RerankRequestError
from tritonforge.tasks.rerank.scores import pair_logits, postprocess, ranked, ranking, sigmoid
from tritonforge.tasks.rerank.tensors import PairStage, decode_pairs, pair_stage, request_top_n


def test_sigmoid_is_exact_and_never_overflows() -> None:
    x = np.array([-1000.0, -3.0, 0.0, 2.5, 1000.0], dtype=np.float32)
    with np.errstate(over="raise"):
        got = sigmoid(x)
    np.testing.assert_allclose(got[1:4], 1 / (1 + np.exp(-x[1:4].astype(np.float64))), rtol=1e-6)
    assert got[0] == 0.0 and got[-1] == 1.0 and got.dtype == np.float32


def test_ranking_is_descending_and_stable_on_ties() -> None:
    scores = np.array([0.5, 0.9, 0.5, 0.1, 0.9], dtype=np.float32)
    assert ranking(scores).tolist() == [1, 4, 0, 2, 3]
    assert ranking(scores, top_n=3).tolist() == [1, 4, 0]
    with pytest.raises(ValueError, match="top_n"):
        ranking(scores, top_n=0)


def test_postprocess_outputs_in_document_order_and_ranking() -> None:
    logits = np.array([[-2.0], [3.0], [0.5]], dtype=np.float32)
    out = postprocess(logits, top_n=2)
    assert out["logits"].tolist() == [-2.0, 3.0, 0.5]
    np.testing.assert_allclose(out["scores"], 1 / (1 + np.exp(-np.array([-2.0, 3.0, 0.5]))))
    assert out["ranking"].tolist() == [1, 2] and out["ranking"].dtype == np.int64
    results = ranked(out["scores"], out["logits"], out["ranking"])
    assert [(r.index, r.logit) for r in results] == [(1, 3.0), (2, 0.5)]
    assert results[0].relevance_score == pytest.approx(0.9525741)


def test_non_finite_logits_and_bad_shapes_are_refused() -> None:
    with pytest.raises(NumericalError, match=r"\[1\]"):
        pair_logits(np.array([[0.0], [np.nan]]))
    with pytest.raises(ValueError, match="shape"):
        pair_logits(np.zeros((2, 3)))


def config(**parameters: str) -> ModelConfig:
    defaults = {
        "query_input": "query",
        "documents_input": "documents",
        "max_documents": "3",
        "max_document_bytes": "10",
        "max_query_bytes": "8",
        "max_length": "512",
        "tokenizer_file": "tokenizer.json",
    }
    merged = {**defaults, **parameters}
    return ModelConfig.from_json(
        json.dumps(
            {
                "name": "rerank_tokenizer",
                "max_batch_size": 0,
                "input": [
                    {"name": "query", "data_type": "TYPE_STRING", "dims": [1]},
                    {"name": "documents", "data_type": "TYPE_STRING", "dims": [-1]},
                ],
                "output": [
                    {"name": n, "data_type": "TYPE_INT64", "dims": [-1, -1]}
                    for n in ("input_ids", "attention_mask")
                ],
                "parameters": {k: {"string_value": v} for k, v in merged.items() if v},
            }
        )
    )


def test_the_stage_reads_names_and_limits_from_its_config() -> None:
    stage = pair_stage(config(truncation="only_second"))
    assert stage == PairStage(
        "query",
        "documents",
        RerankLimits(3, 10, 8),
        512,
        "only_second",
        "tokenizer.json",
        ("input_ids", "attention_mask"),
    )
    assert pair_stage(config()).truncation is None


@pytest.mark.parametrize(
    "parameters",
    [
        {"query_input": "question"},
        {"max_documents": ""},
        {"max_documents": "0"},
        {"max_length": "x"},
    ],
)
def test_a_bad_stage_config_does_not_load(parameters: dict[str, str]) -> None:
    with pytest.raises(ModelConfigError):
        pair_stage(config(**parameters))


def tensors(query: list[object], documents: list[object]) -> dict[str, np.ndarray]:
    return {"query": np.array(query, dtype=object), "documents": np.array(documents, dtype=object)}


def test_decode_pairs_takes_utf8_bytes() -> None:
    stage = pair_stage(config())
    got = decode_pairs(tensors([b"berlin"], [b"a", "é".encode()]), stage)
    assert got == ("berlin", ["a", "é"])


@pytest.mark.parametrize(
    ("inputs", "field"),
    [
        (tensors([b"q", b"q2"], [b"a"]), "query"),
        (tensors([b"q" * 9], [b"a"]), "query"),
        (tensors([b"\xff"], [b"a"]), "query[0]"),
        (tensors([b"q"], []), "documents"),
        (tensors([b"q"], [b"a"] * 4), "documents"),
        (tensors([b"q"], [b"a", b"x" * 11]), "documents[1]"),
        (tensors([b"q"], [b"a", b"\xc3"]), "documents[1]"),
        (tensors([b"q"], [b"a", b"  "]), "documents[1]"),
        ({"documents": np.array([b"a"], dtype=object)}, "query"),
    ],
)
def test_decode_pairs_names_the_tensor(inputs: dict[str, np.ndarray], field: str) -> None:
    with pytest.raises(RerankRequestError) as caught:
        decode_pairs(inputs, pair_stage(config()))
    assert caught.value.field == field
    assert isinstance(caught.value, InvalidInputError)


def test_top_n_comes_from_the_request_parameters() -> None:
    assert request_top_n('{"top_n": 2}', "top_n", 5) == 2
    assert request_top_n('{"top_n": 9}', "top_n", 5) == 5
    assert request_top_n("", "top_n", 5) is None
    assert request_top_n({"other": 1}, "top_n", 5) is None
    for bad in ('{"top_n": 0}', '{"top_n": "2"}', '{"top_n": -3}'):
        with pytest.raises(RerankRequestError) as caught:
            request_top_n(bad, "top_n", 5)
        assert caught.value.field == "top_n"
