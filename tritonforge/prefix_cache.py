"""The keys and values of recent prompts' tokens, so a prompt that starts as an earlier one did
(a chat template's system prompt, a shared instruction, a conversation's earlier turns) is
prefilled from where they part (vLLM's automatic prefix caching, llama.cpp's ``cache_prompt``).

A prompt's cache at position i depends only on its tokens up to i (causal attention), so the
first L columns of any cached prompt serve every prompt whose first L tokens are the same. A
hit becomes a chunked prefill already ``L`` tokens in (:class:`tritonforge.prefill_plan.Partial`,
batch 1): its first token is what the whole prefill gives, as chunking's is (tests:
``tests/unit/test_prefix_cache.py``, the served token-identity tests). Entries are kept in
recency order, at most ``max_entries`` (each one prompt's cache: ~1.8 MB for SmolLM2-135M at
40 tokens); 0 entries: off. A prompt is matched only against prompts of the same ``salt`` (a
request's ``cache_salt``, the front's tenant: vLLM's ``cache_salt``), so a client cannot learn
from its time to first token whether another salt's recent prompt started as its own does.

A prompt sent again as it was (a retry, a regenerated answer, the same question from many
clients) computes nothing: each entry also keeps its prompt's last logits (the first token's:
``vocab`` floats, 192 KiB for SmolLM2-135M, about 4 columns' worth), and :meth:`PrefixCache.repeat`
gives them with the whole cache. They are the bits a prefill of it computes now (a row's logits
depend on its tokens only: the decoders are batch-invariant and a chunked or cached prefill gives
the whole prefill's bits, tests above), so sampling from them is sampling what a prefill would
give; llama.cpp's ``cache_prompt`` computes the last token again, one call for all its slots.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

MIN_PREFIX_TOKENS = 4  # a shorter common prefix saves less than the copy of its cache costs
# tokens a hit leaves to compute: a one-token call takes ONNX Runtime's one-row matmul path,
# whose last bits differ from the prompt-wide call's (measured on the int8 and fp32 decoders:
# only a one-token rest changed the first token's logits), so at least two
MIN_REST_TOKENS = 2


def common_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def check_bounds(max_entries: int, max_tokens: int) -> tuple[int, int]:
    """``(max_entries, max_tokens)``; ValueError naming the config parameter when one is < 0."""
    if max_entries < 0:
        raise ValueError(f"prefix_cache_entries must be >= 0 (0: off), got {max_entries}")
    if max_tokens < 0:
        raise ValueError(f"prefix_cache_tokens must be >= 0 (0: no bound), got {max_tokens}")
    return max_entries, max_tokens


class PrefixCache:
    """``lookup(ids, salt)``: the longest cached prefix of ``ids`` among the prompts stored with
    the same ``salt`` (leaving at least :data:`MIN_REST_TOKENS` to compute) as
    ``(length, cache)``, a copy of batch 1 (``[1, heads, length, head_dim]`` per tensor); None
    below :data:`MIN_PREFIX_TOKENS`. ``repeat(ids, salt)``: the same prompt's whole cache and
    last logits. ``store(ids, cache, salt, logits)``: remember a prefilled prompt's cache (its
    ``len(ids)`` columns) and last logits. Two bounds across every salt, the least recently used
    entries going first: ``max_entries`` and ``max_tokens``, the prompt tokens (cache columns)
    all entries hold together (0: none; a longer prompt is not kept). An entry's memory is its
    tokens times the decoder's bytes per column (and one row of logits), so the tokens bound
    the memory."""

    def __init__(self, max_entries: int, max_tokens: int = 0) -> None:
        self.max_entries, self.max_tokens = check_bounds(max_entries, max_tokens)
        self.tokens = 0  # the prompt tokens all entries hold
        # (salt, prompt ids) -> the prompt's cache, least recently used first
        self._entries: OrderedDict[tuple[str, tuple[int, ...]], list[np.ndarray]] = OrderedDict()
        self._logits: dict[tuple[str, tuple[int, ...]], np.ndarray] = {}  # its last position's
        self.hits = 0
        self.tokens_saved = 0

    def __len__(self) -> int:
        return len(self._entries)

    def _best(
        self, ids: Sequence[int], salt: str
    ) -> tuple[int, tuple[str, tuple[int, ...]] | None]:
        best, best_key = 0, None
        for key in self._entries:
            if key[0] != salt:
                continue
            n = min(common_length(key[1], ids), len(ids) - MIN_REST_TOKENS)
            if n > best:
                best, best_key = n, key
        return (best, best_key) if best >= MIN_PREFIX_TOKENS else (0, None)

    def match(self, ids: Sequence[int], salt: str = "") -> int:
        """The length :meth:`lookup` would give now (0: none), without taking it."""
        return self._best(ids, salt)[0]

    def lookup(self, ids: Sequence[int], salt: str = "") -> tuple[int, list[np.ndarray]] | None:
        best, best_key = self._best(ids, salt)
        if best_key is None:
            return None
        self._entries.move_to_end(best_key)
        self.hits += 1
        self.tokens_saved += best
        return best, [np.ascontiguousarray(p[:, :, :best]) for p in self._entries[best_key]]

    def holds(self, ids: Sequence[int], salt: str = "") -> bool:
        """Whether :meth:`repeat` would give ``ids`` now, without taking it."""
        return (salt, tuple(ids)) in self._logits

    def repeat(
        self, ids: Sequence[int], salt: str = ""
    ) -> tuple[list[np.ndarray], np.ndarray] | None:
        """A prompt stored as it is (same ``salt``, same ids) with its logits: ``(cache,
        logits)``, copies of its ``len(ids)`` columns (batch 1) and of its last position's
        logits; None when no entry is this prompt."""
        key = (salt, tuple(ids))
        logits = self._logits.get(key)
        if logits is None:
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        self.tokens_saved += len(ids)
        return [np.array(p) for p in self._entries[key]], logits.copy()

    def store(
        self,
        ids: Sequence[int],
        cache: Sequence[np.ndarray],
        salt: str = "",
        logits: np.ndarray | None = None,
    ) -> None:
        """Remember a prefilled prompt's cache and (when given) its last position's logits."""
        if not self.max_entries or len(ids) < MIN_PREFIX_TOKENS:
            return
        if self.max_tokens and len(ids) > self.max_tokens:
            return
        key = tuple(ids)
        for old in list(self._entries):
            if old[0] != salt:
                continue
            if old[1] == key:  # this very prompt
                self._entries.move_to_end(old)
                if logits is not None and old not in self._logits:
                    self._logits[old] = np.array(logits, np.float32)
                return
            if old[1][: len(key)] == key:  # an entry already holds all of it
                self._entries.move_to_end(old)
                return
            if key[: len(old[1])] == old[1]:  # this one holds all of an entry
                self._drop(old)
        self._entries[(salt, key)] = [np.array(p[:, :, : len(key)]) for p in cache]
        if logits is not None:
            self._logits[(salt, key)] = np.array(logits, np.float32)
        self.tokens += len(key)
        while len(self._entries) > self.max_entries or (
            self.max_tokens and self.tokens > self.max_tokens
        ):
            self._drop(next(iter(self._entries)))

    def _drop(self, key: tuple[str, tuple[int, ...]]) -> None:
        del self._entries[key]
        self._logits.pop(key, None)
        self.tokens -= len(key[1])
