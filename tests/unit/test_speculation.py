"""Prompt-lookup speculation (``tritonforge.speculation``): the n-gram proposal, the accepted
prefix, and the scheduler with it on against off over a repetitive toy decoder (the same tokens,
text and finish reasons, fewer decoder calls), in both cache paths (copying, in place)."""

from __future__ import annotations

import numpy as np
import pytest

from tritonforge.kv_batch import RIGHT, RightKVBatch
from tritonforge.sampling import SamplingParams
from tritonforge.scheduler import Generation, Scheduler
from tritonforge.speculation import PromptLookup, Speculator, accepted, propose
from tritonforge.text_stream import TextStream

VOCAB, EOS = 12, 0


class Chars:
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + i) for i in ids)


def _next(tokens: np.ndarray) -> int:
    """A repetitive 'model': the token that followed the last token's previous occurrence
    (copying, as a small LM often does), else a hash of the whole prefix; 11 -> EOS after 11."""
    last = tokens[-1]
    earlier = np.flatnonzero(tokens[:-1] == last)
    if earlier.size and (tokens.size + int(tokens.sum())) % 5:
        return int(tokens[earlier[-1] + 1])
    value = int((tokens * np.arange(1, tokens.size + 1)).sum() + tokens.size)
    return EOS if last == 11 else value % 11 + 1


CALLS: list[tuple[int, int]] = []  # (batch, new tokens) of every call


def toy_step(ids, mask, positions, past):
    """Right-padded like GroupQueryAttention: row i's cached length is ``mask[i].sum() - s``;
    its new tokens are stored from there (in ``past`` when it has room: in place, as
    ``OrtDecoder.in_place``, several tokens at batch 1 only), and each position's logits depend
    on exactly the row's tokens up to it."""
    b, s = ids.shape
    CALLS.append((b, s))
    total = mask.shape[1]
    lengths = mask.sum(1) - s if past[0].shape[2] else np.zeros(b, np.int64)
    in_place = past[0].shape[2] >= total and (s == 1 or b == 1)
    present = past if in_place else [np.zeros((b, 1, total, 1), np.float32)]
    if not in_place:
        present[0][:, :, : past[0].shape[2]] = past[0][:, :, :total]
    logits = np.zeros((b, s, VOCAB), np.float32)
    for i in range(b):
        n = int(lengths[i])
        present[0][i, 0, n : n + s, 0] = ids[i]
        for j in range(s):
            logits[i, j, _next(present[0][i, 0, : n + j + 1, 0].astype(np.int64))] = 1.0
    return logits, present


def empty_past(batch: int = 1):
    return [np.zeros((batch, 1, 0, 1), np.float32)]


def run(prompts, lookup, max_new=24, stop=(), headroom=0, running=1, temperature=0.0):
    """Every prompt through one scheduler: ``(tokens, text, finish reason)`` per prompt."""
    sched = Scheduler(
        toy_step,
        empty_past,
        [EOS],
        max_running=running,
        max_queue=16,
        name="g",
        layout=RIGHT,
        kv_headroom=headroom,
        lookup=lookup,
    )
    outs: list[list[tuple[str, str | None]]] = []
    seqs = []
    for p in prompts:
        out: list[tuple[str, str | None]] = []
        outs.append(out)
        seqs.append(
            Generation(
                list(p),
                SamplingParams(max_new_tokens=max_new, stop=tuple(stop), temperature=temperature),
                TextStream(Chars(), stop),
                on_output=lambda s, text, reason, o=out: o.append((text, reason)),
                on_error=lambda s, e, o=out: o.append((str(e), "error")),
                rng=np.random.default_rng(7),
            )
        )
        sched.submit(seqs[-1])
    CALLS.clear()
    sched.run_until_idle()
    results = [
        (s.tokens, "".join(t for t, _ in o), o[-1][1]) for s, o in zip(seqs, outs, strict=True)
    ]
    return results, list(CALLS), sched.speculator


PROMPTS = [
    [1, 2, 3, 4, 1, 2, 3, 4, 1, 2],  # repetitive
    [5, 6, 7, 8, 9, 10, 3],  # no repetition
    [2, 2, 2, 2, 2, 2],
    [3, 9, 4, 3, 9, 4, 3, 9, 5, 6, 3, 9],
    [7, 11, 4],
]


def test_propose_takes_the_longest_recent_ngram_and_what_followed():
    lookup = PromptLookup(num_tokens=3, min_ngram=1, max_ngram=3)
    # "2 3" occurs at 1 and 5; the most recent earlier occurrence (5) is followed by 9, 2, 3
    assert propose([1, 2, 3, 4, 8, 2, 3, 9, 2, 3], lookup) == [9, 2, 3]
    assert propose([1, 2, 3, 4, 8, 2, 3, 9, 2, 3], lookup, limit=1) == [9]
    # the 3-gram "1 2 3" wins over the more recent 1-gram "3"
    assert propose([1, 2, 3, 7, 3, 5, 1, 2, 3], lookup) == [7, 3, 5]
    assert propose([1, 2, 3, 4], lookup) == []  # nothing repeats
    assert propose([4, 4], lookup) == [4]  # the match may run into the suffix
    assert propose([1, 2, 1], PromptLookup(3, 2, 3)) == []  # below min_ngram
    assert propose([1, 2, 1], PromptLookup(0, 1, 3)) == []  # off
    assert propose([1, 2, 1, 2], lookup, limit=0) == []


def test_accepted_counts_the_agreeing_prefix():
    assert accepted([4, 5, 6], [4, 5, 7, 9]) == 2
    assert accepted([4, 5, 6], [4, 5, 6, 9]) == 3
    assert accepted([4], [3, 1]) == 0
    assert accepted([], [3]) == 0


def test_bad_parameters_are_named():
    with pytest.raises(ValueError, match="speculation_min_ngram"):
        PromptLookup(3, 0, 2)
    with pytest.raises(ValueError, match="speculation_tokens"):
        PromptLookup(-1)


@pytest.mark.parametrize("headroom", [0, 4])
@pytest.mark.parametrize("max_new", [5, 24])
@pytest.mark.parametrize("stop", [(), ("db",), ("jj", "bc")])
def test_greedy_output_is_the_same_with_and_without_speculation(headroom, max_new, stop):
    """Tokens, streamed text and finish reasons are those of one-token steps, whether a draft
    is cut by a stop string, the end token or ``max_tokens``; with fewer decoder calls."""
    off, off_calls, _ = run(PROMPTS, None, max_new, stop, headroom)
    on, on_calls, spec = run(PROMPTS, PromptLookup(4, 1, 3), max_new, stop, headroom)
    assert on == off
    assert spec.steps > 0 and spec.accepted > 0 and spec.drafted > spec.accepted
    assert len(on_calls) < len(off_calls) and max(s for _, s in on_calls) > 1
    if max_new == 24 and not stop:
        reasons = {r for _, _, r in off}
        assert reasons == {"stop", "length"}  # both endings are covered
        assert any(len(t) < max_new for t, _, _ in off)


def test_several_rows_sampling_and_processing_do_not_speculate():
    lookup = PromptLookup(4, 1, 3)
    _, calls, spec = run(PROMPTS[:3], lookup, running=3)
    assert spec.steps == sum(1 for b, s in calls if b == 1 and s > 1)  # only once rows left
    assert all(s == 1 for b, s in calls[1:] if b > 1)  # after the prefill of all 3
    _, calls, spec = run(PROMPTS[:1], lookup, temperature=0.7)
    assert spec.steps == 0 and all(s == 1 for _, s in calls[1:])
    seq = Generation([1, 1, 1], SamplingParams(8), TextStream(Chars()), print, print)
    batch = RightKVBatch()
    batch.add(seq, empty_past(1), 0, 1)
    assert Speculator(lookup).draft(batch) == [1]
    seq.processing = object()  # type: ignore[assignment]  # any processing: none
    assert Speculator(lookup).draft(batch) == []


def test_a_draft_leaves_room_for_the_models_own_token():
    seq = Generation([1, 1, 1, 1, 1], SamplingParams(3), TextStream(Chars()), print, print)
    seq.tokens = [1]
    batch = RightKVBatch()
    batch.add(seq, empty_past(1), 0, 1)
    assert Speculator(PromptLookup(4, 1, 3)).draft(batch) == [1]  # 2 left: 1 drafted
    seq.tokens = [1, 1]
    assert Speculator(PromptLookup(4, 1, 3)).draft(batch) == []
