"""Constrained decoding on the real exported SmolLM2 decoders, in-process (GenerateEngine: the
served model's artifacts, config and scheduler): JSON schemas of our own give outputs that parse
and validate on int8 and fp32, in one batch with unconstrained rows; unconstrained greedy output
stays token-identical (to the export's PyTorch reference on fp32, and with and without a
logprobs-only hook on both); recorded logprobs equal log_softmax of a direct decoder call."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

from tests.conftest import PIPELINE_REPOSITORY
from tritonforge.scheduler import Generation

pytestmark = pytest.mark.integration

_S = {"type": "string", "minLength": 1, "maxLength": 24}
SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {"name": _S, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"],
    },
    {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {"name": _S, "email": _S},
                "required": ["name", "email"],
                "additionalProperties": False,
            },
            "active": {"type": "boolean"},
        },
        "required": ["user", "active"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "minItems": 1,
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {
                        "sku": _S,
                        "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                    },
                    "required": ["sku", "qty"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["items"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "size": {"type": "string", "enum": ["S", "M", "L"]},
        },
        "required": ["color", "size"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "celsius": {"type": "number", "minimum": -50, "maximum": 60},
            "humidity": {"type": "integer", "minimum": 0, "maximum": 100},
        },
        "required": ["celsius", "humidity"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": _S, "maxItems": 4}, "title": _S},
        "required": ["tags", "title"],
        "additionalProperties": False,
    },
    {"type": "object"},  # json_object
]
PROMPTS = [
    "Describe a person as JSON with a name and an age.",
    "Give a user record as JSON: user (name, email) and whether they are active.",
    "List two items of a shopping order as JSON with sku and quantity.",
    "Pick a t-shirt color and size; answer in JSON.",
    "Report today's weather in Paris as JSON.",
    "Suggest a blog post title and some tags, as JSON.",
    "Answer in JSON: what is the capital of France?",
]
MAX_TOKENS = 160


@cache
def model_dir(variant: str) -> Path:
    from tritonforge.pipelines import generator_from_repository

    try:
        group = generator_from_repository(PIPELINE_REPOSITORY)
    except LookupError:
        pytest.skip(reason=f"no generation models in {PIPELINE_REPOSITORY} (run `make export`)")
    if variant not in group.variants:
        pytest.skip(reason=f"the {variant} decoder is not exported")
    return PIPELINE_REPOSITORY / group.model(variant)


@cache
def engine(variant: str) -> Any:
    from tritonforge.generate_engine import GenerateEngine
    from tritonforge.modelconfig import ModelConfig

    config = ModelConfig.from_pbtxt((model_dir(variant) / "config.pbtxt").read_text())
    return GenerateEngine(config, model_dir(variant) / "1")


@cache
def grammar_tokenizer(variant: str) -> Any:
    from tritonforge.tasks.generation.structured import GrammarTokenizer

    e = engine(variant)
    return GrammarTokenizer(e.tokenizer, e.eos_ids[0], e.tokenizer.get_vocab_size())


def _response_format(schema: dict[str, Any]) -> dict[str, Any]:
    if schema == {"type": "object"}:
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}}


def _sequence(variant: str, prompt: str, values: dict[str, Any], max_tokens: int) -> Generation:
    from tritonforge.tasks.generation.structured import parse_structured

    e = engine(variant)
    out: list[str] = []
    seq = e.build(
        prompt,
        {"max_tokens": max_tokens},
        on_output=lambda s, text, reason: (out.append(text), setattr(s, "reason", reason)),
        on_error=lambda s, err: pytest.fail(str(err)),
    )
    params = parse_structured(values, e.tokenizer.get_vocab_size())
    seq.processing = params.chain(grammar_tokenizer(variant))
    seq.text = out  # type: ignore[attr-defined]
    return seq


def _run(variant: str, seqs: list[Generation]) -> None:
    sched = engine(variant).scheduler
    for s in seqs:
        sched.submit(s)
    sched.run_until_idle()


@pytest.mark.parametrize("variant", ["int8", "fp32"])
def test_schemas_give_valid_json_in_a_batch_with_unconstrained_rows(variant: str) -> None:
    free_prompts = PROMPTS[:2]
    alone = [_sequence(variant, p, {}, 24) for p in free_prompts]
    _run(variant, alone)
    constrained = [
        _sequence(variant, p, {"response_format": _response_format(s)}, MAX_TOKENS)
        for p, s in zip(PROMPTS, SCHEMAS, strict=True)
    ]
    free = [_sequence(variant, p, {}, 24) for p in free_prompts]
    _run(variant, [*constrained, *free])
    for seq, schema in zip(constrained, SCHEMAS, strict=True):
        text = "".join(seq.text)  # type: ignore[attr-defined]
        assert seq.reason == "stop", (schema, text)  # type: ignore[attr-defined]
        jsonschema.validate(json.loads(text), schema)
    assert [s.tokens for s in free] == [s.tokens for s in alone]


@pytest.mark.parametrize("variant", ["int8", "fp32"])
def test_unconstrained_greedy_is_token_identical_with_and_without_the_hook(variant: str) -> None:
    from tritonforge.export.specs.smollm2 import smollm2_spec

    n = smollm2_spec().fidelity_new_tokens
    report = json.loads((model_dir(variant) / "1" / "export_report.json").read_text())
    reference = report["fidelity"]["reference"][:4] if variant == "fp32" else []
    prompts = [r["prompt"] for r in reference] or PROMPTS[:4]
    plain = [_sequence(variant, p, {}, n) for p in prompts]
    assert all(s.processing is None for s in plain)
    _run(variant, plain)
    hooked = [_sequence(variant, p, {"logprobs": True, "top_logprobs": 3}, n) for p in prompts]
    _run(variant, hooked)
    assert [s.tokens for s in hooked] == [s.tokens for s in plain]
    if reference:
        assert [s.tokens for s in plain] == [r["tokens"] for r in reference]


def test_logprobs_equal_log_softmax_of_a_direct_fp32_decoder_call() -> None:
    e = engine("fp32")
    seq = _sequence("fp32", PROMPTS[6], {"logprobs": True, "top_logprobs": 5}, 4)
    _run("fp32", [seq])
    entries = seq.processing.logprobs.entries  # type: ignore[union-attr]
    assert [x.token for x in entries[: len(seq.tokens)]] == seq.tokens
    for k, entry in enumerate(entries[:3]):
        ids = np.asarray([seq.prompt_ids + seq.tokens[:k]], np.int64)
        mask = np.ones_like(ids)
        positions = np.arange(ids.shape[1], dtype=np.int64)[None]
        logits, _ = e.decoder(ids, mask, positions, e.decoder.empty_past(1))
        row = logits[0, -1].astype(np.float64)
        reference = row - (row.max() + np.log(np.exp(row - row.max()).sum()))
        assert abs(entry.logprob - reference[entry.token]) < 1e-4
        assert [t for t, _ in entry.top] == np.argsort(-reference, kind="stable")[:5].tolist()
        np.testing.assert_allclose(
            [lp for _, lp in entry.top], reference[[t for t, _ in entry.top]], atol=1e-4
        )
