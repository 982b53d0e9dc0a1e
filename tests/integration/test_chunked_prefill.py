"""Chunked prefill on the real exported decoder (ONNX Runtime, the default variant's graph):
the served engine in-process gives every prompt the same greedy tokens whether its prompt is
prefilled whole or in chunks of a few tokens (batch 1 after its own cache), with rows already
decoding and prompts of different lengths, and the decoder's last logits are bit-identical; the
same holds when a prompt goes on from an earlier prompt's cache (the prefix cache)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import PIPELINE_REPOSITORY
from tritonforge.modelconfig import ModelConfig
from tritonforge.prefill_plan import chunk_end, chunk_inputs
from tritonforge.prefix_cache import PrefixCache

pytestmark = pytest.mark.integration

PROMPTS = (
    ("Hi", False),
    ("What is the capital of France?", True),
    ("Name a color.", False),
    ("Explain how a bicycle works, in one short paragraph for a child.", True),
    ("Count to three.", True),
)


@pytest.fixture(scope="module")
def engine():  # type: ignore[no-untyped-def]
    from tritonforge.generate_engine import GenerateEngine
    from tritonforge.pipelines import generator_from_repository

    try:
        model_dir = PIPELINE_REPOSITORY / generator_from_repository(PIPELINE_REPOSITORY).model()
    except (LookupError, OSError):
        pytest.skip(reason="the generate pipeline is not exported (make export)")
    config = ModelConfig.from_pbtxt((model_dir / "config.pbtxt").read_text())
    engine = GenerateEngine(config, model_dir / "1")
    yield engine
    engine.close()


def _tokens(
    engine,
    chunk_tokens: int | None,
    stall_row_tokens: int = 0,
    prefix_entries: int = 0,
    prefix: PrefixCache | None = None,
) -> list[list[int]]:  # type: ignore[no-untyped-def]
    """Two prompts decode first; the others arrive two steps later (rows running). ``prefix``:
    a cache to keep (else a new one of ``prefix_entries``)."""
    sched = engine.scheduler
    sched.chunk_tokens, sched.stall_row_tokens = chunk_tokens, stall_row_tokens
    sched.prefix = prefix if prefix is not None else PrefixCache(prefix_entries)
    seqs = [
        engine.build(text, {"max_tokens": 10, "chat_template": template}, *[lambda *_: None] * 2)
        for text, template in PROMPTS
    ]
    for seq in seqs[:2]:
        sched.submit(seq)
    sched.step()
    sched.step()
    for seq in seqs[2:]:
        sched.submit(seq)
    sched.run_until_idle()
    assert all(s.finished for s in seqs)
    return [s.tokens for s in seqs]


def test_chunked_prefill_gives_the_greedy_tokens_of_whole_prefills(engine) -> None:  # type: ignore[no-untyped-def]
    lengths = [len(engine.prompt_ids(t, c)) for t, c in PROMPTS]
    assert min(lengths) < 7 < 16 < max(lengths)  # some prompts are chunked, some are not
    whole = _tokens(engine, None)
    assert all(whole)
    for chunk_tokens in (7, 16):
        assert _tokens(engine, chunk_tokens) == whole, chunk_tokens
    # the chunk by running rows (prefill_stall_row_tokens): the first wave whole, then chunks
    # of 20 // rows (at least 5) tokens as rows start and end
    assert _tokens(engine, 5, 20) == whole


def test_a_chunked_prefill_computes_the_whole_prefills_logits(engine) -> None:  # type: ignore[no-untyped-def]
    decoder = engine.decoder
    ids = engine.prompt_ids(PROMPTS[3][0], True)
    whole, _ = decoder(*chunk_inputs(ids, 0, len(ids)), decoder.empty_past())
    for chunk_tokens in (5, 16):
        done, past = 0, decoder.empty_past()
        while done < len(ids):
            end = chunk_end(done, len(ids), chunk_tokens)
            logits, presents = decoder(*chunk_inputs(ids, done, end), past)
            past, done = [np.ascontiguousarray(p[:, :, :end]) for p in presents], end
        assert np.array_equal(logits[0, -1], whole[0, -1]), chunk_tokens


def test_prompts_going_on_from_an_earlier_prompts_cache_get_their_greedy_tokens(engine) -> None:  # type: ignore[no-untyped-def]
    whole = _tokens(engine, None)
    for chunk_tokens in (None, 7, 32):
        assert _tokens(engine, chunk_tokens, prefix_entries=8) == whole, chunk_tokens
        # the chat-templated prompts share the system prompt: the later ones went on from it
        assert engine.scheduler.prefix.hits >= 2 and engine.scheduler.prefix.tokens_saved > 20


def test_prompts_sent_again_get_their_greedy_tokens_and_are_not_prefilled(engine) -> None:  # type: ignore[no-untyped-def]
    """The same prompts a second time go on from their own cache and stored first logits: the
    real decoder computes no prefill for them (only for a prompt too short to be kept) and
    every greedy token is the whole prefill's."""
    from tritonforge.prefix_cache import MIN_PREFIX_TOKENS

    whole = _tokens(engine, None)
    assert _tokens(engine, 7, prefix_entries=8) == whole
    sched, prefills = engine.scheduler, []
    step_fn = sched.step_fn

    def counted(ids, mask, positions, past):  # type: ignore[no-untyped-def]
        prefills.extend([ids.shape] if ids.shape[1] > 1 or mask.shape[1] == ids.shape[1] else [])
        return step_fn(ids, mask, positions, past)

    sched.step_fn = counted
    try:
        again = _tokens(engine, 7, prefix=sched.prefix)
    finally:
        sched.step_fn = step_fn
    short = [t for t, c in PROMPTS if len(engine.prompt_ids(t, c)) < MIN_PREFIX_TOKENS]
    assert again == whole and short and len(prefills) == len(short), prefills


def test_a_prefill_from_another_prompts_cache_computes_the_whole_prefills_logits(engine) -> None:  # type: ignore[no-untyped-def]
    decoder = engine.decoder
    first = engine.prompt_ids(PROMPTS[1][0], True)
    ids = engine.prompt_ids(PROMPTS[3][0], True)
    cache = PrefixCache(1)
    _, presents = decoder(*chunk_inputs(first, 0, len(first)), decoder.empty_past())
    cache.store(first, presents)
    hit = cache.lookup(ids)
    assert hit is not None and hit[0] > 20
    whole, _ = decoder(*chunk_inputs(ids, 0, len(ids)), decoder.empty_past())
    logits, _ = decoder(*chunk_inputs(ids, hit[0], len(ids)), hit[1])
    assert np.array_equal(logits[0, -1], whole[0, -1])
    # the same prompt again: all but the last two tokens from the cache (a one-token call's
    # last bits differ, so the cache never leaves only one)
    again = cache.lookup(first)
    assert again is not None and again[0] == len(first) - 2
    logits, _ = decoder(*chunk_inputs(first, again[0], len(first)), again[1])
    whole, _ = decoder(*chunk_inputs(first, 0, len(first)), decoder.empty_past())
    assert np.array_equal(logits[0, -1], whole[0, -1])
