"""Prompt-lookup speculation on the exported fp32 decoder (real ONNX Runtime, tokenizer and
chat template, in process through ``GenerateEngine``): greedy output with it equals greedy
output without it, on prompts with and without repetition, with stop strings and with
``max_tokens`` reached inside a draft. (int8 is not token-identical: its verifying pass differs
from one-token steps by ~0.8 in the logits; ``tritonforge.speculation``.)"""

from __future__ import annotations

import dataclasses
from functools import cache

import pytest

from tests.conftest import PIPELINE_REPOSITORY
from tritonforge.generate_engine import GenerateEngine
from tritonforge.modelconfig import ModelConfig
from tritonforge.pipelines import generator_from_repository
from tritonforge.speculation import MAX_NGRAM_KEY, MIN_NGRAM_KEY, TOKENS_KEY

pytestmark = pytest.mark.integration

PROMPTS = (
    "Describe the water cycle.",  # little repetition
    "Repeat the following sentence three times: The quick brown fox jumps over the lazy dog.",
    "Fix the typo and copy the rest unchanged: def add(a, b):\n    retrun a + b\n\n"
    "def sub(a, b):\n    return a - b",
)
# (request, why): max_tokens small enough that drafts are cut by it; a stop string
REQUESTS = (
    {"max_tokens": 40},
    {"max_tokens": 23},
    {"max_tokens": 40, "stop": ["lazy dog.\n", "return a"]},
)


@cache
def engine(tokens: int) -> GenerateEngine:
    try:
        model_dir = PIPELINE_REPOSITORY / generator_from_repository(PIPELINE_REPOSITORY).model(
            "fp32"
        )
    except LookupError:
        pytest.skip(reason=f"no generation models in {PIPELINE_REPOSITORY} (run `make export`)")
    config = ModelConfig.from_pbtxt((model_dir / "config.pbtxt").read_text())
    lookup = {TOKENS_KEY: str(tokens), MIN_NGRAM_KEY: "2", MAX_NGRAM_KEY: "4"}
    config = dataclasses.replace(config, parameters={**config.parameters, **lookup})
    return GenerateEngine(config, model_dir / "1")


def generate(e: GenerateEngine, prompt: str, values: dict) -> tuple[list[int], str, str | None]:
    chunks: list[tuple[str, str | None]] = []
    seq = e.build(prompt, values, lambda _, t, r: chunks.append((t, r)), pytest.fail)
    e.scheduler.submit(seq)
    e.scheduler.run_until_idle()
    return seq.tokens, "".join(t for t, _ in chunks), chunks[-1][1]


@pytest.mark.parametrize("values", REQUESTS)
def test_greedy_output_is_the_same_with_and_without_prompt_lookup(values: dict) -> None:
    off, on = engine(0), engine(4)
    before = on.scheduler.speculator.accepted
    for prompt in PROMPTS:
        assert generate(on, prompt, values) == generate(off, prompt, values), prompt
    assert on.scheduler.speculator.accepted > before  # it did speculate, and kept drafts
    assert off.scheduler.speculator.steps == 0
