"""The prefix cache (issue #35, ``prefix_cache``): a prompt that starts as a recent one did is
prefilled from where they part, with the tokens of its whole prefill, and the decoder never
computes the shared tokens again. Toy decoders from ``test_generation`` (right-padded layouts:
the cache is off for left-padded ones)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.test_chunked_prefill import _logged
from tests.unit.test_generation import EOS, empty_past, make, toy_in_place_step, toy_right_step
from tritonforge.errors import InvalidInputError
from tritonforge.generation import CACHE_SALT_PARAMETER, MAX_CACHE_SALT_CHARS, cache_salt
from tritonforge.kv_batch import LEFT, RIGHT
from tritonforge.prefix_cache import MIN_PREFIX_TOKENS, PrefixCache, common_length
from tritonforge.scheduler import Scheduler

SYSTEM = [11, 12, 13, 14, 15, 16, 17, 18]  # a chat template's shared start
PROMPTS = [[*SYSTEM, 3, 1, 4], [*SYSTEM, 1, 5, 9, 2, 6], [*SYSTEM, 3, 1, 5, 9], [2, 7, 1]]
STEPS = {RIGHT: toy_right_step, "in place": toy_in_place_step}


def _cache(n: int, fill: float) -> list[np.ndarray]:
    return [np.full((1, 2, n, 3), fill, np.float32) for _ in range(4)]


def test_a_lookup_gives_the_longest_shared_start_and_leaves_the_last_token() -> None:
    assert common_length([1, 2, 3], [1, 2, 4]) == 2 and common_length([1], [1, 2]) == 1
    cache = PrefixCache(4)
    cache.store([*SYSTEM, 3, 1, 4], _cache(11, 1.0))
    cache.store([*SYSTEM[:5], 9, 9], _cache(7, 2.0))
    length, past = cache.lookup([*SYSTEM, 3, 1, 5])  # type: ignore[misc]
    assert length == 9 and past[0].shape == (1, 2, 9, 3) and float(past[0][0, 0, 0, 0]) == 1.0
    assert cache.lookup([*SYSTEM, 3, 1, 4])[0] == 9  # type: ignore[index]  # two left to compute
    assert cache.lookup([11, 12, 13, 99]) is None  # below MIN_PREFIX_TOKENS
    assert MIN_PREFIX_TOKENS == 4 and cache.lookup([5, 5, 5, 5, 5]) is None
    past[0][...] = 7.0  # a copy: the entry stays as it was
    assert float(cache.lookup([*SYSTEM, 3, 0])[1][0][0, 0, 0, 0]) == 1.0  # type: ignore[index]
    assert cache.hits == 3 and cache.tokens_saved == 9 + 9 + 8


def test_entries_are_kept_by_recency_and_a_covered_prompt_is_not_stored_twice() -> None:
    cache = PrefixCache(2)
    cache.store([1, 2, 3, 4, 5, 6], _cache(6, 1.0))
    cache.store([1, 2, 3, 4, 5], _cache(5, 2.0))  # held in the first: not stored
    assert len(cache) == 1
    cache.store([1, 2, 3, 4, 5, 6, 7], _cache(7, 3.0))  # holds the first: replaces it
    assert len(cache) == 1 and cache.lookup([1, 2, 3, 4, 5, 6, 7, 8, 9])[0] == 7  # type: ignore[index]
    cache.store([7, 7, 7, 7], _cache(4, 4.0))
    cache.lookup([1, 2, 3, 4, 5, 0, 0])  # the first is now the most recent
    cache.store([8, 8, 8, 8], _cache(4, 5.0))  # evicts [7, 7, 7, 7]
    assert cache.lookup([7, 7, 7, 7, 0, 0]) is None and cache.lookup([8, 8, 8, 8, 0, 0]) is not None
    off = PrefixCache(0)
    off.store([1, 2, 3, 4, 5], _cache(5, 1.0))
    assert len(off) == 0 and off.lookup([1, 2, 3, 4, 5, 6, 7]) is None
    with pytest.raises(ValueError, match="prefix_cache_entries"):
        PrefixCache(-1)


def test_the_entries_hold_at_most_max_tokens_together() -> None:
    """The tokens bound the memory: the least recently used go first until the rest fit; a
    prompt longer than the bound is not kept (an entry's memory is its tokens' columns)."""
    cache = PrefixCache(8, max_tokens=12)
    cache.store([1, 2, 3, 4, 5], _cache(5, 1.0))
    cache.store([6, 7, 8, 9, 10], _cache(5, 2.0))
    assert len(cache) == 2 and cache.tokens == 10
    cache.lookup([1, 2, 3, 4, 5, 0, 0])  # the first is now the most recent
    cache.store([11, 12, 13, 14], _cache(4, 3.0))  # 14 > 12: the least recent goes
    assert cache.tokens == 9 and cache.match([6, 7, 8, 9, 10, 0, 0]) == 0
    assert cache.match([1, 2, 3, 4, 5, 0, 0]) == 5 and cache.match([11, 12, 13, 14, 0, 0]) == 4
    cache.store([1, 2, 3, 4, 5, 6, 7], _cache(7, 4.0))  # replaces the entry it holds: 4 + 7
    assert len(cache) == 2 and cache.tokens == 11
    cache.store(list(range(20, 33)), _cache(13, 5.0))  # 13 tokens: longer than the bound
    assert len(cache) == 2 and cache.tokens == 11 and cache.match(list(range(20, 35))) == 0
    assert sum(len(ids) for _, ids in cache._entries) == cache.tokens
    with pytest.raises(ValueError, match="prefix_cache_tokens"):
        PrefixCache(8, max_tokens=-1)


def test_a_prompt_matches_only_prompts_of_its_own_salt() -> None:
    cache = PrefixCache(2)
    cache.store([*SYSTEM, 3, 1, 4], _cache(11, 1.0), salt="tenant a")
    assert cache.match([*SYSTEM, 3, 1, 5]) == 0  # the shared namespace: nothing of a's
    assert cache.lookup([*SYSTEM, 3, 1, 5], salt="tenant b") is None
    assert cache.match([*SYSTEM, 3, 1, 5], salt="tenant a") == 9  # two left to compute
    cache.store([*SYSTEM, 3], _cache(9, 2.0))  # held in a's entry, but not a's: stored
    assert len(cache) == 2 and cache.lookup([*SYSTEM, 3, 1, 5])[0] == 9  # type: ignore[index]
    cache.store([*SYSTEM, 3, 1, 4], _cache(11, 3.0), salt="tenant b")  # one bound for all
    assert len(cache) == 2 and cache.match([*SYSTEM, 3, 1, 5], salt="tenant a") == 0
    assert cache.lookup([*SYSTEM, 3, 1, 4, 0], salt="tenant b")[1][0][0, 0, 0, 0] == 3.0  # type: ignore[index]


def test_a_cache_salt_is_a_bounded_string() -> None:
    assert cache_salt({}) == "" and cache_salt({CACHE_SALT_PARAMETER: "team-7"}) == "team-7"
    for bad in (7, None, ["a"], "x" * (MAX_CACHE_SALT_CHARS + 1)):
        with pytest.raises(InvalidInputError, match=CACHE_SALT_PARAMETER):
            cache_salt({CACHE_SALT_PARAMETER: bad})


def _run(
    layout: str, chunk_tokens: int | None, entries: int, salts: tuple[str, ...] = ()
) -> tuple[list[list[int]], int]:
    """The first prompt decodes alone; the others arrive while it runs (each with its salt in
    ``salts``, default the shared one). ``(tokens, prompt tokens the decoder computed)``."""
    log: list[tuple[str, int, int]] = []
    sched = Scheduler(
        _logged(STEPS[layout], log), empty_past, [EOS], max_running=8, max_queue=8,
        name="generate", layout=RIGHT, kv_headroom=4 if layout == "in place" else 0,
        prefill_chunk_tokens=chunk_tokens, prefix_cache_entries=entries,
    )  # fmt: skip
    seqs = [make(p, 6) for p in PROMPTS]
    for seq, salt in zip(seqs, salts, strict=False):
        seq.cache_salt = salt
    sched.submit(seqs[0])
    sched.step()
    for s in seqs[1:]:
        sched.submit(s)
    sched.run_until_idle()
    assert all(s.finished for s in seqs)
    computed = sum(b * s for kind, b, s in log if kind != "decode")
    return [s.tokens for s in seqs], computed


@pytest.mark.parametrize("layout", list(STEPS))
@pytest.mark.parametrize("chunk_tokens", [None, 4, 64])
def test_prompts_sharing_a_start_give_the_tokens_of_whole_prefills(
    layout: str, chunk_tokens: int | None
) -> None:
    whole, computed = _run(layout, chunk_tokens, 0)
    assert all(len(t) == 6 for t in whole)
    cached, computed_cached = _run(layout, chunk_tokens, 8)
    assert cached == whole
    # the two later prompts that start as the first did skip its 8 (and 9) shared tokens
    assert computed - computed_cached >= 2 * len(SYSTEM)


def test_prompts_of_other_salts_are_prefilled_whole_with_the_same_tokens() -> None:
    whole, computed = _run(RIGHT, 4, 0)
    salted, computed_salted = _run(RIGHT, 4, 8, ("a", "b", "c", "d"))
    assert salted == whole and computed_salted == computed  # nothing shared across salts
    shared, computed_shared = _run(RIGHT, 4, 8, ("a", "a", "a", "a"))
    assert shared == whole and computed - computed_shared >= 2 * len(SYSTEM)


def test_left_padded_decoders_keep_no_prefix_cache() -> None:
    sched = Scheduler(
        toy_right_step, empty_past, [EOS], max_running=2, max_queue=2, name="generate",
        layout=LEFT, prefix_cache_entries=8,
    )  # fmt: skip
    assert sched.prefix.max_entries == 0


def test_queued_prompts_from_the_cache_start_in_one_iteration_within_its_time() -> None:
    """The toy step takes no time, so every cached prompt queued fits the iteration: the two
    that start as the first did are prefilled back to back, no decode step between."""
    log: list[tuple[str, int, int]] = []
    sched = Scheduler(
        _logged(toy_right_step, log), empty_past, [EOS], max_running=8, max_queue=8,
        name="generate", layout=RIGHT, prefix_cache_entries=8,
    )  # fmt: skip
    seqs = [make(p, 6) for p in PROMPTS]
    sched.submit(seqs[0])
    sched.step()
    assert [kind for kind, _, _ in log] == ["prefill", "decode"]
    for s in seqs[1:3]:
        sched.submit(s)
    sched.step()
    assert [kind for kind, _, _ in log[2:]] == ["chunk", "chunk", "decode"], log
    assert sched.prefix.hits == 2


def test_a_prompt_stored_with_its_logits_is_given_whole_again_as_copies() -> None:
    cache = PrefixCache(2)
    ids, logits = [*SYSTEM, 3, 1, 4], np.arange(5, dtype=np.float32)
    cache.store(ids, _cache(11, 1.0), logits=logits)
    logits[0] = 99.0  # the entry keeps its own copy
    assert cache.holds(ids) and not cache.holds(ids, salt="tenant a") and not cache.holds(ids[:-1])
    past, again = cache.repeat(ids)  # type: ignore[misc]
    assert past[0].shape == (1, 2, 11, 3) and again.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    past[0][...], again[...] = 7.0, 7.0  # copies: the entry stays as it was
    past, again = cache.repeat(ids)  # type: ignore[misc]
    assert float(past[0][0, 0, 0, 0]) == 1.0 and float(again[0]) == 0.0
    assert cache.hits == 2 and cache.tokens_saved == 2 * len(ids)
    assert cache.repeat(ids, salt="tenant a") is None and cache.repeat([*ids, 5]) is None
    bare = [*SYSTEM, 9, 9]
    cache.store(bare, _cache(10, 2.0))  # no logits: only its start serves
    assert not cache.holds(bare) and cache.repeat(bare) is None and cache.match(bare) == 8
    cache.store(bare, _cache(10, 2.0), logits=np.ones(5, np.float32))  # now it has them
    assert cache.holds(bare) and len(cache) == 2
    cache.store([5, 5, 5, 5], _cache(4, 3.0), logits=np.ones(5, np.float32))  # evicts `ids`
    assert not cache.holds(ids) and cache.repeat(ids) is None and len(cache._logits) == 2


def test_a_prompt_sent_again_computes_nothing_and_gives_the_tokens_of_its_prefill() -> None:
    """Two prompts run, then both again (reversed): the second time neither is prefilled
    (no prefill or chunk call), each row only decodes, and every row's tokens are those of a
    scheduler without the cache (the stored logits are the prompt's own, not another's)."""

    def run(entries: int) -> tuple[list[list[int]], list[tuple[str, int, int]]]:
        log: list[tuple[str, int, int]] = []
        sched = Scheduler(
            _logged(toy_right_step, log), empty_past, [EOS], max_running=8, max_queue=8,
            name="generate", layout=RIGHT, prefix_cache_entries=entries,
        )  # fmt: skip
        first = [make(p, 6) for p in PROMPTS[:2]]
        for s in first:
            sched.submit(s)
        sched.run_until_idle()
        calls = len(log)
        again = [make(p, 6) for p in reversed(PROMPTS[:2])]
        for s in again:
            sched.submit(s)
        sched.run_until_idle()
        assert all(s.finished for s in first + again)
        return [s.tokens for s in first + again], log[calls:]

    plain, plain_log = run(0)
    cached, cached_log = run(8)
    assert cached == plain and cached[0] == cached[3] and cached[1] == cached[2]
    assert cached[0] != cached[1]  # the prompts' own answers: a swap would show
    assert {kind for kind, _, _ in plain_log} == {"prefill", "decode"}
    assert {kind for kind, _, _ in cached_log} == {"decode"}, cached_log
    assert cached_log[0] == ("decode", 2, 1)  # both joined in one iteration
