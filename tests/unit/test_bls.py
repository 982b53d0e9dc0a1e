"""The ``embed_bls`` plan and its batching: encoder calls per shape, outputs back per request."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tritonforge.bls import EncoderTarget, build_plan
from tritonforge.bls_calls import (
    EncoderCall,
    call_with_spare,
    plan_encoder_calls,
    run_calls,
    split_encoder_output,
)
from tritonforge.bls_parameters import request_variant
from tritonforge.errors import InvalidInputError, StageUnavailableError
from tritonforge.export.pipeline_configs import write_pipeline
from tritonforge.export.specs import get_pipeline
from tritonforge.export.tritonconfig import render_pbtxt
from tritonforge.modelconfig import pbtxt_to_dict
from tritonforge.repository import load_model_config
from tritonforge.triton import Answers

ENCODER = EncoderTarget("enc", {"ids": "input_ids", "mask": "attention_mask"}, "emb")
ENCODERS = {
    "fp32": ENCODER,
    "int8": EncoderTarget("enc8", ENCODER.inputs, "emb"),
    "other": EncoderTarget("odd", {"ids": "input_ids"}, "emb"),
}


def tokens(rows: int, length: int, start: int) -> dict[str, np.ndarray]:
    ids = np.arange(start, start + rows * length, dtype=np.int64).reshape(rows, length)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def fake_encoder(inputs: dict[str, np.ndarray]) -> np.ndarray:
    """One row per input row that identifies it: (first id, length)."""
    ids = inputs["ids"]
    return np.stack([ids[:, 0], np.full(len(ids), ids.shape[1])], axis=1).astype(np.float32)


def test_equal_shapes_share_one_call_and_every_request_gets_its_own_rows() -> None:
    parts = [(0, tokens(1, 16, 1)), (3, tokens(2, 32, 100)), (5, tokens(3, 16, 500))]
    calls = plan_encoder_calls(parts, ENCODER)
    assert sorted(c.size for c in calls) == [2, 4]  # the two 16-token requests are merged
    for call in calls:
        assert set(call.inputs) == {"ids", "mask"}  # renamed to the encoder's inputs
    got = {}
    for call in calls:
        got.update(split_encoder_output(fake_encoder(call.inputs), call, ENCODER))
    for index, part in parts:
        expected = fake_encoder({"ids": part["input_ids"]})
        np.testing.assert_array_equal(got[index], expected)


@pytest.fixture
def plan_repo(tmp_path: Path) -> Path:
    """The default pipeline's generated configs over one stand-in fp32 encoder; the BLS still
    lists the int8 and TorchScript encoders (as if they had been removed after the export)."""
    root = tmp_path / "repo"
    (root / "encoder_fp32" / "1").mkdir(parents=True)
    tensors = ", ".join(
        f'{{ name: "{n}" data_type: TYPE_INT64 dims: [ -1 ] }}'
        for n in ("input_ids", "attention_mask", "token_type_ids")
    )
    (root / "encoder_fp32" / "config.pbtxt").write_text(
        'name: "encoder_fp32"\nbackend: "onnxruntime"\nmax_batch_size: 64\n'
        f"input [ {tensors} ]\n"
        'output [ { name: "sentence_embedding" data_type: TYPE_FP32 dims: [ 384 ] } ]\n'
    )
    write_pipeline(get_pipeline("minilm"), root)
    path = root / "embed_bls" / "config.pbtxt"
    config = pbtxt_to_dict(path.read_text())
    config["parameters"]["encoder_models"]["string_value"] = (
        "fp32=encoder_fp32,int8=encoder_int8,torchscript=encoder_torchscript"
    )
    path.write_text(render_pbtxt(config))
    return root


def test_plan_reads_tokenizer_settings_and_marks_unexported_variants(plan_repo: Path) -> None:
    plan = build_plan(load_model_config(plan_repo, "embed_bls"), plan_repo)
    tokenizer = load_model_config(plan_repo, "tokenizer")
    assert plan.tokenizer.path == plan_repo / "tokenizer" / "1" / "tokenizer.json"
    assert plan.tokenizer.max_length == tokenizer.param("max_length", kind=int)
    assert plan.tokenizer.pad_to_multiple_of == tokenizer.param("pad_to_multiple_of", kind=int)
    assert set(plan.encoders) == {"fp32"}
    assert plan.encoders["fp32"].output == "sentence_embedding"
    assert plan.max_concurrent_calls == plan.encoders["fp32"].instances == 1  # Triton's default
    assert set(plan.missing) == {"int8", "torchscript"}
    assert request_variant(None, plan) == "fp32"
    with pytest.raises(StageUnavailableError, match="run `make export`"):
        request_variant('{"variant": "int8"}', plan)


def test_an_execute_calls_the_encoder_as_often_at_once_as_it_has_instances(
    plan_repo: Path,
) -> None:
    path = plan_repo / "encoder_fp32" / "config.pbtxt"
    path.write_text(
        path.read_text() + "instance_group [ { count: 2 kind: KIND_CPU }, { count: 1 } ]\n"
    )
    plan = build_plan(load_model_config(plan_repo, "embed_bls"), plan_repo)
    assert plan.encoders["fp32"].instances == plan.max_concurrent_calls == 3


def test_unknown_variant_is_named_but_a_long_one_is_not_echoed(plan_repo: Path) -> None:
    plan = build_plan(load_model_config(plan_repo, "embed_bls"), plan_repo)
    with pytest.raises(InvalidInputError, match="'fp16' is unknown"):
        request_variant({"variant": "fp16"}, plan)
    with pytest.raises(InvalidInputError) as info:
        request_variant({"variant": "x" * 10_000}, plan)
    assert len(str(info.value)) < 200
    with pytest.raises(InvalidInputError, match="not valid JSON"):
        request_variant("{", plan)


def _calls(spare: str | None = None) -> list[EncoderCall]:
    parts = [(0, tokens(1, 16, 1)), (1, tokens(1, 32, 100)), (2, tokens(1, 48, 200))]
    return [EncoderCall(b, "fp32", "fp32", -1, spare) for b in plan_encoder_calls(parts, ENCODER)]


def test_a_refused_call_is_retried_once_on_its_spare_and_other_errors_are_returned() -> None:
    full = StageUnavailableError("stage 'enc' failed: Exceeds maximum queue size")
    seen: list[str] = []

    def run(call: EncoderCall, target: EncoderTarget) -> np.ndarray:
        seen.append(target.model)
        if target.model == "enc":
            raise full
        return fake_encoder(call.batch.inputs)

    call = _calls(spare="int8")[0]
    done = call_with_spare(call, ENCODERS, run)
    assert (done.variant, done.error, done.degraded) == ("int8", None, True)
    assert seen == ["enc", "enc8"]
    for spare in (None, "other"):  # no spare, or one fed other inputs: the refusal stands
        done = call_with_spare(_calls(spare)[0], ENCODERS, run)
        assert done.error is full and done.output is None and not done.degraded
    broken = StageUnavailableError("stage 'enc' failed: boom")
    done = call_with_spare(call, ENCODERS, lambda c, t: (_ for _ in ()).throw(broken))
    assert done.error is broken  # not a refusal: not retried


def test_run_calls_yields_every_call_once_concurrently_on_a_pool() -> None:
    calls = _calls()
    started = threading.Barrier(len(calls))

    def run(call: EncoderCall, target: EncoderTarget) -> np.ndarray:
        started.wait(timeout=10)  # breaks unless every call runs at once
        return fake_encoder(call.batch.inputs)

    with ThreadPoolExecutor(len(calls)) as pool:
        done = list(run_calls(calls, ENCODERS, run, pool))
    assert all(d.error is None for d in done)
    assert sorted(id(d.call) for d in done) == sorted(id(c) for c in calls)
    alone = list(run_calls(calls, ENCODERS, lambda c, t: fake_encoder(c.batch.inputs)))
    assert [d.call for d in alone] == calls  # no pool: in order, in this thread


def test_answers_each_request_once_and_fails_the_rest() -> None:
    sent: dict[int, list[tuple[str, int]]] = {0: [], 1: [], 2: []}

    class Req:
        def __init__(self, i: int) -> None:
            self.i = i

        def get_response_sender(self) -> Any:
            return SimpleNamespace(send=lambda r, flags=0: sent[self.i].append((r, flags)))

    answers = Answers(
        SimpleNamespace(TRITONSERVER_RESPONSE_COMPLETE_FINAL=1), [Req(i) for i in range(3)]
    )
    answers.send(1, "ok")
    answers.send(1, "again")  # dropped
    assert answers.pending() == [0, 2]
    answers.fail_pending(lambda: "error")
    assert sent == {0: [("error", 1)], 1: [("ok", 1)], 2: [("error", 1)]}
