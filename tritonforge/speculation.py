"""Prompt-lookup speculative decoding (vLLM's ``ngram`` speculator, transformers'
``prompt_lookup_num_tokens``) for a lone greedy row: the longest recent n-gram of the row's
prompt + generated tokens is looked up earlier in that text (:func:`propose`), the tokens that
followed it are the draft, one decoder call over ``[last token, *draft]`` verifies them, and the
row keeps the longest prefix greedy decoding agrees with plus the model's own next token
(:func:`accepted`); the rejected columns of the cache are dropped by not counting them (a
right-padded row's length is its mask's row sum, so the next step overwrites them).

When it applies (:meth:`Speculator.draft`): ``num_tokens`` > 0 (config parameters, below), one
running row (ONNX Runtime's ``GroupQueryAttention`` takes several new tokens after a past only
at batch 1), a right-padded cache (``kv_batch.RightKVBatch``), greedy decoding
(``temperature`` 0) and no logits processing (``Generation.processing`` None: no structured
output, no logprobs, no penalties); anything else decodes one token per step as before.

Exactness: the verifying call computes the draft's positions in one multi-row pass, so its
logits equal the one-token steps' only up to the kernels' arithmetic: ~3e-5 for the fp32
graph, ~0.8 for int8 (``MatMulNBits`` int8 compute quantizes activations, which amplifies the
multi-row kernels' different summation order); a near-tie between two tokens can then go the
other way (docs/performance.md, "Prompt lookup").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tritonforge.kv_batch import RightKVBatch

if TYPE_CHECKING:
    from tritonforge.kv_batch import Batch
    from tritonforge.scheduler import Generation, StepFn

# The config parameters (the spec's ``GenerationServing``); absent: no speculation.
TOKENS_KEY, MIN_NGRAM_KEY, MAX_NGRAM_KEY = (
    "speculation_tokens",
    "speculation_min_ngram",
    "speculation_max_ngram",
)

EmitFn = Callable[["Generation", np.ndarray, int], int]
"""``(sequence, logits row, tokens per response) -> token``: the scheduler's ``_emit``."""


@dataclass(frozen=True)
class PromptLookup:
    """``num_tokens``: draft tokens per step at most (0: off); the n-gram looked up is the
    longest of ``max_ngram`` .. ``min_ngram`` tokens that occurs earlier."""

    num_tokens: int = 0
    min_ngram: int = 3
    max_ngram: int = 4

    def __post_init__(self) -> None:
        if self.num_tokens < 0 or not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(
                f"{TOKENS_KEY} must be >= 0 and 1 <= {MIN_NGRAM_KEY} <= {MAX_NGRAM_KEY}, got "
                f"{self.num_tokens}, {self.min_ngram} and {self.max_ngram}"
            )


def propose(context: Sequence[int], lookup: PromptLookup, limit: int | None = None) -> list[int]:
    """The draft after ``context``: for the longest n (``max_ngram`` down to ``min_ngram``)
    whose last n tokens occur earlier in ``context``, the (at most ``num_tokens``, at most
    ``limit``) tokens that followed their most recent earlier occurrence; [] when none does."""
    k = lookup.num_tokens if limit is None else min(lookup.num_tokens, limit)
    if k <= 0:
        return []
    tokens = np.asarray(context, dtype=np.int64)
    for n in range(min(lookup.max_ngram, len(tokens) - 1), lookup.min_ngram - 1, -1):
        # windows starting at 0 .. len - n - 1: every occurrence before the suffix itself
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)
        hits = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return [int(t) for t in tokens[start : start + k]]
    return []


def accepted(draft: Sequence[int], greedy: Sequence[int]) -> int:
    """How many leading draft tokens greedy decoding agrees with (``greedy[j]``: the argmax
    after the draft's first j tokens)."""
    count = 0
    for proposed, chosen in zip(draft, greedy, strict=False):
        if proposed != chosen:
            break
        count += 1
    return count


@dataclass
class Speculator:
    """The scheduler's prompt lookup: :meth:`draft` for the running batch, :meth:`verify` runs
    it; ``steps``, ``drafted`` and ``accepted`` count what it did (the bench's acceptance)."""

    lookup: PromptLookup
    steps: int = 0
    drafted: int = 0
    accepted: int = 0

    def draft(self, batch: Batch) -> list[int]:
        """The draft for ``batch``'s next step ([]: decode one token as usual)."""
        if not self.lookup.num_tokens or len(batch) != 1 or not isinstance(batch, RightKVBatch):
            return []
        seq = batch.rows[0]
        if seq.params.temperature != 0.0 or seq.processing is not None:
            return []
        # the model's own token comes with every step: the draft leaves room for it
        left = seq.params.max_new_tokens - len(seq.tokens) - 1
        return propose([*seq.prompt_ids, *seq.tokens], self.lookup, left)

    def verify(self, batch: Batch, step_fn: StepFn, draft: list[int], emit: EmitFn) -> None:
        """One decoder call over ``[last, *draft]`` for ``batch``'s lone row (a draft from
        :meth:`draft`); emits the agreed draft tokens and the model's next one (in one response;
        a stop string, an end token or ``max_tokens`` ends the row mid-way as in one-token
        steps) and keeps their columns."""
        if not isinstance(batch, RightKVBatch):
            raise TypeError("prompt lookup needs a right-padded cache (kv_batch.RightKVBatch)")
        seq, width = batch.rows[0], len(draft) + 1
        ids = np.array([[int(batch.last[0]), *draft]], np.int64)
        batch.reserve(width)
        mask = batch.step_mask(width)
        positions = batch.positions[:, None] + np.arange(width, dtype=np.int64)
        logits, presents = step_fn(ids, mask, positions, batch.past)
        agreed = accepted(draft, [int(t) for t in logits[0].argmax(-1)])
        batch.advance(presents, mask, agreed + 1)
        self.steps, self.drafted, self.accepted = (
            self.steps + 1,
            self.drafted + len(draft),
            self.accepted + agreed,
        )
        for j in range(agreed + 1):
            batch.last[0] = emit(seq, logits[0, j], agreed + 1)
            if seq.finished:
                break
