"""Client-side discovery and typed classification results (pure functions; fake responses)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fake_repository import write_model
from tritonforge.client.discovery import (
    DiscoveryError,
    choose,
    fallback,
    grpc_config,
    index_names,
    select,
)
from tritonforge.client.errors import InvalidRequestError, ModelNotFoundError
from tritonforge.pipelines import Pipeline, discover
from tritonforge.tasks.classification import client as classification
from tritonforge.tasks.classification.client import Ranked, decode, prepare

LABELS = ("negative", "neutral", "positive")


def public(
    pipeline: str,
    task: str,
    role: str,
    name: str,
    variant: str = "",
    **extra: object,
) -> dict[str, Any]:
    params = {
        "tritonforge.pipeline": pipeline,
        "tritonforge.task": task,
        "tritonforge.role": role,
        "max_items": 4,
        "max_text_bytes": 32,
        **extra,
    }
    if variant:
        params["tritonforge.variant"] = variant
    if task == "classification":
        params["tritonforge.labels"] = json.dumps(list(LABELS))
        outputs = [
            {"name": "label", "data_type": "TYPE_STRING", "dims": [1]},
            {"name": "score", "data_type": "TYPE_FP32", "dims": [1]},
            {"name": "probabilities", "data_type": "TYPE_FP32", "dims": [3]},
            {"name": "top_labels", "data_type": "TYPE_STRING", "dims": [-1]},
            {"name": "top_scores", "data_type": "TYPE_FP32", "dims": [-1]},
        ]
    else:
        outputs = [{"name": "embedding", "data_type": "TYPE_FP32", "dims": [8]}]
    return {
        "name": name,
        "input": [{"name": "text", "data_type": "TYPE_STRING", "dims": [1]}],
        "output": outputs,
        "parameters": {k: {"string_value": str(v)} for k, v in params.items()},
    }


def stage(pipeline: str, task: str, role: str, name: str) -> dict[str, Any]:
    return {"name": name, "parameters": {
        "tritonforge.pipeline": {"string_value": pipeline},
        "tritonforge.task": {"string_value": task},
        "tritonforge.role": {"string_value": role},
    }}  # fmt: skip


def catalog(*extra: dict[str, Any]) -> dict[str, Pipeline]:
    """A primary embedding pipeline (unprefixed stages), a user's embedder and a classifier."""
    return discover(
        [
            stage("embed", "embedding", "tokenizer", "tokenizer"),
            public("embed", "embedding", "ensemble", "embed", "fp32"),
            public("embed", "embedding", "ensemble", "embed_int8", "int8"),
            stage("distil", "embedding", "tokenizer", "distil_tokenizer"),
            public("distil", "embedding", "ensemble", "distil", "fp32"),
            stage("mood", "classification", "tokenizer", "mood_tokenizer"),
            public("mood", "classification", "ensemble", "mood", "fp32"),
            public("mood", "classification", "bls", "mood_bls", encoder_models="fp32=x,int8=y"),
            *extra,
        ]
    )


def test_the_default_pipeline_of_a_task_is_discovered_not_named() -> None:
    found = catalog()
    assert choose(found, "classification").name == "mood"  # the only classifier
    assert choose(found, "embedding").name == "embed"  # two embedders: the unprefixed one
    assert choose(found, "embedding", "distil").name == "distil"
    pipeline, model, params = select(found, "classification", None, "bls", "int8")
    assert (pipeline.name, model, params) == ("mood", "mood_bls", {"variant": "int8"})
    assert pipeline.dim == 3 and pipeline.max_items == 4


def test_unknown_wrong_task_or_ambiguous_pipelines_name_the_field() -> None:
    found = catalog()
    with pytest.raises(ModelNotFoundError, match=r"name='nope'.*'distil', 'embed', 'mood'"):
        choose(found, "embedding", "nope")
    with pytest.raises(InvalidRequestError, match="name='distil' is a embedding pipeline"):
        choose(found, "classification", "distil")
    two = catalog(
        stage("b", "classification", "tokenizer", "b_tokenizer"),
        public("b", "classification", "ensemble", "b", "fp32"),
    )
    with pytest.raises(InvalidRequestError, match=r"several classification pipelines.*name="):
        choose(two, "classification")
    only_embed = {k: v for k, v in found.items() if v.task == "embedding"}
    with pytest.raises(ModelNotFoundError, match="no classification pipeline"):
        choose(only_embed, "classification")


def test_classify_calls_are_checked_against_the_discovered_facts() -> None:
    mood = catalog()["mood"]
    assert prepare(mood, ["a"], "bls", 2, 3) == (2, {"top_k": 2, "version": "3"}, {})
    assert prepare(mood, ["a"], "ensemble", None, 2) == (None, {}, {"model_version": "2"})
    for texts, top_k, field in (
        (["a"] * 5, None, "max_items=4"),
        (["x" * 33], None, r"texts\[0\] is 33 bytes.*max_text_bytes=32"),
        (["a"], 4, "'top_k'=4 is out of range"),
        (["a"], 0, "'top_k'=0 is out of range"),
    ):
        with pytest.raises(InvalidRequestError, match=field):
            prepare(mood, texts, "bls", top_k, None)
    with pytest.raises(InvalidRequestError, match="not a classifier"):
        prepare(catalog()["embed"], ["a"], "ensemble", None, None)


class FakeResult:
    def __init__(self, arrays: dict[str, np.ndarray], response: Any = None) -> None:
        self.arrays, self.response = arrays, response

    def as_numpy(self, name: str) -> np.ndarray | None:
        return self.arrays.get(name)

    def get_response(self) -> Any:
        return self.response or {}


def answer(k: int = 2) -> dict[str, np.ndarray]:
    probs = np.array([[0.1, 0.2, 0.7], [0.5, 0.4, 0.1]], dtype=np.float32)
    order = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    names = np.array([s.encode() for s in LABELS], dtype=object)
    return {
        "label": names[order[:, :1]],
        "score": np.take_along_axis(probs, order[:, :1], 1),
        "probabilities": probs,
        "top_labels": names[order],
        "top_scores": np.take_along_axis(probs, order, 1),
    }


def test_decode_gives_typed_results_and_ranks_beyond_the_servers_k() -> None:
    mood = catalog()["mood"]
    first, second = decode(FakeResult(answer()), mood, 2, None, "ctx")
    assert first.label == "positive" and first.score == pytest.approx(0.7)
    assert first.probabilities == pytest.approx({"negative": 0.1, "neutral": 0.2, "positive": 0.7})
    assert [t.label for t in first.top] == ["positive", "neutral"]
    assert second.top[0] == Ranked("negative", pytest.approx(0.5))
    assert first.model_version is None
    # an ensemble answered with k=1, the caller asked for 3: ranked from the probabilities
    [_, wide] = decode(FakeResult(answer(k=1)), mood, 2, 3, "ctx")
    assert [t.label for t in wide.top] == ["negative", "neutral", "positive"]
    narrow = decode(FakeResult(answer(k=3)), mood, 2, 1, "ctx")
    assert all(len(r.top) == 1 for r in narrow)


def test_decode_reads_which_version_answered_when_the_response_says_so() -> None:
    mood = catalog()["mood"]
    per_row = {**answer(), "model_version": np.array([[b"2"], [b"1"]], dtype=object)}
    assert [r.model_version for r in decode(FakeResult(per_row), mood, 2, None, "c")] == ["2", "1"]
    in_params = FakeResult(answer(), {"parameters": {"model_version": 3}})
    assert {r.model_version for r in decode(in_params, mood, 2, None, "c")} == {"3"}


def test_decode_rejects_answers_that_break_the_contract() -> None:
    from tritonforge.client.errors import ResponseError

    mood = catalog()["mood"]
    broken = answer()
    broken["label"] = np.array([[b"happy"], [b"negative"]], dtype=object)
    with pytest.raises(ResponseError, match="'happy' is not one of"):
        decode(FakeResult(broken), mood, 2, None, "ctx")
    with pytest.raises(ResponseError, match=r"shape \[3, 3\]"):
        decode(FakeResult(answer()), mood, 3, None, "ctx")
    missing = {k: v for k, v in answer().items() if k != "probabilities"}
    with pytest.raises(ResponseError, match="no 'probabilities'"):
        decode(FakeResult(missing), mood, 2, None, "ctx")
    assert classification.REQUIRED == ("label", "score", "probabilities")


def test_index_and_grpc_configs_read_as_triton_json() -> None:
    from tritonclient.grpc import service_pb2

    rows = [{"name": "b", "state": "READY"}, {"name": "a", "state": "UNAVAILABLE"}, {"name": "c"}]
    assert index_names(rows) == ["b", "c"]
    assert index_names({"models": rows}) == ["b", "c"]
    response = service_pb2.ModelConfigResponse()
    response.config.name = "embed"
    out = response.config.output.add()
    out.name, out.data_type = "embedding", 11  # TYPE_FP32
    out.dims.extend([384])
    response.config.parameters["tritonforge.pipeline"].string_value = "embed"
    config = grpc_config(response)
    assert config["output"][0] == {"name": "embedding", "data_type": "TYPE_FP32", "dims": [384]}
    assert config["parameters"]["tritonforge.pipeline"] == {"string_value": "embed"}


def test_refused_configs_fall_back_to_the_local_repository_or_say_what_to_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    refused = InvalidRequestError("HTTP 403: this API is restricted: send the admin key")
    with pytest.raises(DiscoveryError, match="TRITONFORGE_ADMIN_KEY"):
        fallback(refused, "ctx")
    with pytest.raises(DiscoveryError, match="TRITONFORGE_ADMIN_KEY"):
        fallback(InvalidRequestError("HTTP 400: something else"), "ctx")
    write_model(tmp_path / "model_repository", "mood", "mood", "ensemble", variant="fp32")
    assert sorted(fallback(refused, "ctx")) == ["mood"]
