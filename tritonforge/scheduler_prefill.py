"""The scheduler's prefill steps (:class:`PrefillSteps`, a base of
:class:`tritonforge.scheduler.Scheduler`): admit queued sequences into free slots, prefill
them (whole, or in chunks: :mod:`tritonforge.prefill_plan`), emit each one's first token and
queue it to join the running batch."""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from tritonforge.errors import ServingError
from tritonforge.prefill_plan import (
    Partial,
    call_budget,
    chunk_end,
    chunk_inputs,
    chunked,
    group_inputs,
    group_size,
    iteration_chunk,
)
from tritonforge.prefix_cache import PrefixCache
from tritonforge.queue_forecast import ServiceRate

if TYPE_CHECKING:
    from tritonforge.kv_batch import Batch
    from tritonforge.scheduler import Generation, StepFn


class PrefillSteps:
    """Admission and prefill over the scheduler's state (declared here, set by it)."""

    name: str
    cond: threading.Condition
    waiting: deque[Generation]
    batch: Batch
    joining: deque[tuple[Generation, list[np.ndarray], int, int]]
    max_running: int
    max_prefill_tokens: int
    chunk_tokens: int | None
    stall_row_tokens: int
    partial: Partial | None
    prefix: PrefixCache
    prefilling: list[Generation]
    prefill_ends_s: float
    rate: ServiceRate
    clock: Callable[[], float]
    step_fn: StepFn
    empty_past: Callable[[int], list[np.ndarray]]

    def _emit(self, seq: Generation, logits: np.ndarray, per_response: int = 1) -> int:
        raise NotImplementedError  # the scheduler's: sample, record and stream one token

    def _admit(self) -> None:
        """Prefill what fits one call (:meth:`_admit_call`); after a prompt that went on from
        the prefix cache, the next such queued prompts too while the iteration's prefill time
        stays within one chunk's (:meth:`_another_hit`): the few tokens each computes are
        cheap, so a wave of cached prompts starts together rather than one per step."""
        started_s = self.clock()
        while self._admit_call() and self._another_hit(self.clock() - started_s):
            pass

    def _another_hit(self, spent_s: float) -> bool:
        """Whether the queue's head goes on from the prefix cache and fits this iteration: a
        slot is free and, with rows decoding or joining, ``spent_s`` is within the rate's time
        for one chunk (``prefill_chunk_tokens``; whole prefills: ``max_prefill_tokens``)."""
        with self.cond:
            running = len(self.batch) + len(self.joining)
            if running >= self.max_running or not self.waiting or self.partial is not None:
                return False
            if not self._from_cache(self.waiting[0]):
                return False
            # one chunk's time, whatever runs: a larger share (the chunk by running rows, or
            # two chunks) stalled the joining rows past inter-token p99 for no TTFT gain
            # (docs/performance.md, "Prefix cache")
            limit = self.chunk_tokens or self.max_prefill_tokens
            return running == 0 or spent_s <= self.rate.prefill_s(limit)

    def _from_cache(self, seq: Generation) -> bool:
        """Whether ``seq``'s prompt goes on from the prefix cache (a shared start, or itself)."""
        ids, salt = seq.prompt_ids, seq.cache_salt
        return bool(self.prefix.match(ids, salt)) or self.prefix.holds(ids, salt)

    def _admit_call(self) -> bool:
        """Prefill what fits one call (:mod:`tritonforge.prefill_plan`: free slots, padded
        tokens; with chunking, the next chunk of a prompt under way first, and a queued prompt
        that starts as a cached one does (:mod:`tritonforge.prefix_cache`) goes on from there,
        and one sent again as it was computes nothing), emit each finished prompt's first token,
        and queue it to join the batch (:meth:`_join`). True when it was a prompt from the
        prefix cache, now prefilled."""
        admitted: list[Generation] = []
        again: tuple[list[np.ndarray], np.ndarray] | None = None
        from_cache = False
        with self.cond:
            running = len(self.batch) + len(self.joining)
            chunk = iteration_chunk(running, self.chunk_tokens, self.stall_row_tokens)
            if self.partial is None:
                free = self.max_running - running
                queued = list(itertools.islice(self.waiting, max(0, free)))
                head = queued[0] if queued else None
                again = self.prefix.repeat(head.prompt_ids, head.cache_salt) if head else None
                hit = (
                    self.prefix.lookup(head.prompt_ids, head.cache_salt)
                    if head and again is None
                    else None
                )
                if again is not None:  # sent as it was: its cache and first logits are kept
                    seq = self.waiting.popleft()
                    seq.admitted_s = self.clock()
                elif hit is not None:  # its first tokens' cache is an earlier prompt's
                    seq = self.waiting.popleft()
                    seq.admitted_s = self.clock()
                    self.partial, from_cache = Partial(seq, hit[1], hit[0]), True
                else:
                    # whole prompts together up to the next one a cached prompt starts
                    plain = next(
                        (i for i, s in enumerate(queued[1:], 1) if self._from_cache(s)),
                        len(queued),
                    )
                    lengths = [len(s.prompt_ids) for s in queued[:plain]]
                    budget = call_budget(self.max_prefill_tokens, chunk)
                    admitted = [
                        self.waiting.popleft() for _ in range(group_size(lengths, free, budget))
                    ]
                    if admitted and chunked(lengths[0], chunk):
                        self.partial, admitted = Partial(admitted[0], self.empty_past(1)), []
            self.prefilling = admitted  # neither waiting nor running: the forecast counts them
        if again is not None:
            cache, logits = again
            self._first_token(seq, logits, cache, len(seq.prompt_ids))
            return True
        if self.partial is not None:
            self._prefill_chunk(self.partial, chunk)
        if not admitted:
            return from_cache and self.partial is None
        try:
            self._prefill(admitted)
        finally:
            self.prefilling = []
        return False

    def _prefill(self, admitted: list[Generation]) -> None:
        started_s = self.clock()
        for seq in admitted:
            seq.admitted_s = started_s
        lengths = [len(s.prompt_ids) for s in admitted]
        padded = max(lengths) * len(admitted)
        self.prefill_ends_s = started_s + self.rate.prefill_s(padded)
        ids, mask, positions = group_inputs([s.prompt_ids for s in admitted])
        try:
            logits, presents = self.step_fn(ids, mask, positions, self.empty_past(len(admitted)))
            self.rate.observe_prefill(self.clock() - started_s, padded)
        except Exception as e:
            for seq in admitted:
                self._prefill_failed(seq, e)
            return
        for i, (seq, n) in enumerate(zip(admitted, lengths, strict=True)):
            self._first_token(seq, logits[i, n - 1], [p[i : i + 1] for p in presents], n)

    def _prefill_chunk(self, part: Partial, chunk: int | None) -> None:
        """The next chunk (at most ``chunk`` tokens; None: the rest) of a prompt prefilled in
        chunks (batch 1, after its own cache); its last one gives the first token."""
        seq, n, started_s = part.seq, len(part.seq.prompt_ids), self.clock()
        if part.done == 0:
            seq.admitted_s = started_s
        self.prefill_ends_s = started_s + self.rate.prefill_s(part.left)
        end = chunk_end(part.done, n, chunk)
        try:
            logits, presents = self.step_fn(
                *chunk_inputs(seq.prompt_ids, part.done, end), part.past
            )
            self.rate.observe_prefill(self.clock() - started_s, end - part.done)
        except Exception as e:
            self.partial = None
            self._prefill_failed(seq, e)
            return
        if end < n:
            part.past, part.done = [np.ascontiguousarray(p[:, :, :end]) for p in presents], end
            return
        self.partial = None
        self._first_token(seq, logits[0, -1], presents, n)

    def _prefill_failed(self, seq: Generation, e: Exception) -> None:
        seq.fail(ServingError(f"{self.name}: prefill failed ({type(e).__name__}: {e})"))

    def _first_token(
        self, seq: Generation, logits: np.ndarray, row: list[np.ndarray], n: int
    ) -> None:
        """Emit a prefilled row's first token; it joins the batch with its ``n`` columns of
        ``row`` (batch 1) unless that ended it."""
        self.prefix.store(seq.prompt_ids, row, seq.cache_salt, logits)
        token = self._emit(seq, logits)
        if not seq.finished:
            self.joining.append((seq, [np.ascontiguousarray(p[:, :, :n]) for p in row], n, token))
