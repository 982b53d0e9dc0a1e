"""Structured generation's engine pieces (tasks/generation/structured): request parameters and
their 400s, logit_bias and penalties, the llguidance grammar mask over a real byte-level BPE
tokenizer, logprobs against a direct computation, and the scheduler hook (no processing: the
tokens of today's path; rows with and without processing in one batch)."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
import torch

from tests.unit.test_generation import EOS, empty_past, make, run_alone, toy_step
from tritonforge.scheduler import Scheduler
from tritonforge.tasks.generation.structured import (
    GrammarTokenizer,
    LogitBias,
    LogprobRecorder,
    Penalties,
    RowChain,
    StructuredInputError,
    chat_logprobs,
    completion_logprobs,
    json_schema_of,
    parse_structured,
    token_logprob,
)

SCHEMA = {
    "type": "object",
    "properties": {
        "kind": {"enum": ["cat", "dog"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
        "ok": {"type": "boolean"},
    },
    "required": ["kind", "n", "ok"],
    "additionalProperties": False,
}


def _format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "t", "schema": schema, "strict": True}}


@pytest.fixture(scope="module")
def tokenizer():
    """A small byte-level BPE (every byte is a token, as in SmolLM2's), eos id 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = ['{"kind":"cat","n":3,"ok":true}', '{"name": "dog", "tags": ["a", "b"]}'] * 50
    tok.train_from_iterator(corpus, trainer)
    return tok


@pytest.fixture(scope="module")
def grammar_tokenizer(tokenizer):
    return GrammarTokenizer(tokenizer, 0, tokenizer.get_vocab_size())


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": "{not json"}, "response_format"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
            "response_format.json_schema.name",
        ),
        ({"response_format": _format({"type": 5})}, "response_format.json_schema.schema"),
        (
            {"response_format": _format({"properties": {"a": {"$ref": "#/nope"}}})},
            "response_format.json_schema.schema",
        ),
        ({"logit_bias": {"99999": 1}}, "logit_bias.99999"),
        ({"logit_bias": {"3": 101}}, "logit_bias.3"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": "a"}, "frequency_penalty"),
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
    ],
)
def test_bad_values_are_invalid_input_naming_the_field(values, field):
    with pytest.raises(StructuredInputError) as e:
        parse_structured(values, 1000)
    assert e.value.field == field and str(e.value).startswith(field + ":")
    assert e.value.code == "INVALID_ARG"


def test_no_structured_field_means_no_processing():
    assert parse_structured({}, 1000).chain(None) is None
    assert parse_structured({"response_format": {"type": "text"}}, 1000).chain(None) is None
    assert json_schema_of({"type": "json_object"}) == {"type": "object"}
    params = parse_structured({"logit_bias": '{"7": -100}', "logprobs": "true"}, 1000)
    assert params.logit_bias == {7: -100.0} and params.logprobs and params.top_logprobs == 0


def test_logit_bias_and_penalties_follow_openai_formula():
    logits = np.arange(6, dtype=np.float32)
    chain = RowChain([LogitBias({1: 10.0, 4: -2.5}), Penalties(0.5, 0.25)])
    for t in (2, 2, 3):
        chain.accept(t, logits)
    out = chain.process(logits)
    expected = np.arange(6, dtype=np.float32)
    expected[1] += 10.0
    expected[4] -= 2.5
    expected[2] -= 2 * 0.25 + 0.5
    expected[3] -= 1 * 0.25 + 0.5
    np.testing.assert_allclose(out, expected)
    np.testing.assert_array_equal(logits, np.arange(6))  # the raw row is not changed
    assert RowChain([]).process(logits) is logits


def test_grammar_mask_allows_a_valid_instance_and_then_only_stop(tokenizer, grammar_tokenizer):
    proc = grammar_tokenizer.matcher(SCHEMA)
    text = json.dumps({"kind": "dog", "n": 7, "ok": False}, separators=(",", ":"))
    for t in tokenizer.encode(text).ids:
        row = np.zeros(tokenizer.get_vocab_size(), np.float32)
        proc.apply(row)
        assert np.isfinite(row[t]), tokenizer.decode([t])
        assert np.isinf(row).any()  # the grammar forbids something at every step
        proc.accept(t)
    row = np.zeros(tokenizer.get_vocab_size(), np.float32)
    proc.apply(row)
    assert np.flatnonzero(np.isfinite(row)).tolist() == [0]
    assert proc.error is None


@pytest.mark.parametrize("seed", range(5))
def test_sampling_under_the_mask_gives_valid_json(tokenizer, grammar_tokenizer, seed):
    rng = np.random.default_rng(seed)
    params = parse_structured({"response_format": _format(SCHEMA)}, tokenizer.get_vocab_size())
    chain = params.chain(grammar_tokenizer)
    assert chain is not None
    tokens: list[int] = []
    for _ in range(200):
        logits = rng.standard_normal(tokenizer.get_vocab_size()).astype(np.float32) * 3
        masked = chain.process(logits)
        p = np.exp(masked - masked.max())
        token = int(rng.choice(len(p), p=p / p.sum()))
        chain.accept(token, logits)
        if token == 0:
            break
        tokens.append(token)
    assert token == 0
    jsonschema.validate(json.loads(tokenizer.decode(tokens)), SCHEMA)


def test_json_object_accepts_any_object_only(tokenizer, grammar_tokenizer):
    proc = grammar_tokenizer.matcher(json_schema_of({"type": "json_object"}) or {})
    row = np.zeros(tokenizer.get_vocab_size(), np.float32)
    proc.apply(row)
    allowed = {tokenizer.decode([int(t)]) for t in np.flatnonzero(np.isfinite(row))}
    assert allowed and all(a.startswith("{") for a in allowed)


def test_logprobs_equal_log_softmax_and_top_is_ordered():
    rng = np.random.default_rng(1)
    logits = (rng.standard_normal(49152) * 4).astype(np.float32)
    reference = torch.log_softmax(torch.from_numpy(logits).double(), 0).numpy()
    got = token_logprob(logits, 123, 20)
    assert abs(got.logprob - reference[123]) < 1e-9
    order = np.argsort(-reference, kind="stable")[:20]
    assert [t for t, _ in got.top] == order.tolist()
    np.testing.assert_allclose([lp for _, lp in got.top], reference[order], atol=1e-9)
    assert token_logprob(logits, 5, 0).top == ()


def test_logprob_shapes_for_chat_and_completions(tokenizer):
    rec = LogprobRecorder(top_n=2)
    ids = tokenizer.encode('{"kind"').ids
    for t in ids:
        logits = np.zeros(tokenizer.get_vocab_size(), np.float32)
        logits[t] = 5.0
        rec.record(t, logits)
    chat = chat_logprobs(tokenizer, rec.entries)["content"]
    assert "".join(c["token"] for c in chat) == '{"kind"'
    assert all(bytes(c["bytes"]).decode() == c["token"] for c in chat)
    assert all(
        len(c["top_logprobs"]) == 2 and c["top_logprobs"][0]["token"] == c["token"] for c in chat
    )
    legacy = completion_logprobs(tokenizer, rec.entries)
    assert legacy["tokens"] == [c["token"] for c in chat]
    assert legacy["text_offset"][0] == 0 and len(legacy["top_logprobs"]) == len(ids)
    assert legacy["token_logprobs"] == [c["logprob"] for c in chat]


def test_scheduler_rows_with_and_without_processing_share_a_batch():
    prompts = [[1, 2, 3], [4], [5, 6]]
    alone = [run_alone(p) for p in prompts]
    sched = Scheduler(toy_step, empty_past, [EOS], max_running=3, max_queue=8, name="generate")
    seqs = [make(p, 6) for p in prompts]
    seqs[1].processing = RowChain([LogitBias({7: 100.0})], LogprobRecorder(1))
    seqs[2].processing = RowChain([], LogprobRecorder(0))  # logprobs only: same tokens
    for s in seqs:
        sched.submit(s)
    sched.run_until_idle()
    assert seqs[0].tokens == alone[0] and seqs[2].tokens == alone[2]
    assert seqs[1].tokens == [7] * 6
    recorded = seqs[1].processing.logprobs.entries  # type: ignore[union-attr]
    assert [e.token for e in recorded] == [7] * 6  # the raw logits: 7 is not their argmax
    raw_best = [e for e in recorded if e.top[0][0] != 7]
    assert raw_best and all(e.logprob < e.top[0][1] for e in raw_best)
    assert max(sched.batch_sizes) == 3
