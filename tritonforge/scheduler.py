"""The in-flight (iteration-level) batch scheduler of text generation: :class:`Generation` is
one request, :class:`Scheduler` admits, prefills, decodes and retires them over a step function.

The decoder contract (see ``tasks.generation.export.module``)::

    step(input_ids [b, s], attention_mask [b, past + s], position_ids [b, s], past)
        -> (logits [b, s, vocab], presents)      # past/presents: 2 * layers arrays [b, h, t, d]

with the running batch's rows in the step's cache ``layout`` (:mod:`tritonforge.kv_batch`):
left-padded, or right-padded (each row from column 0, its length the mask's row sum; a
right-padded step may ignore ``position_ids``). Prefills are right-padded in both.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from tritonforge.errors import ServingError, StageUnavailableError
from tritonforge.kv_batch import LEFT, RIGHT, Batch, new_batch
from tritonforge.prefill_plan import Partial, check_chunk_tokens, check_stall_row_tokens
from tritonforge.prefix_cache import PrefixCache
from tritonforge.queue_forecast import (
    Queued,
    ServiceRate,
    admit_budget_s,
    late_in_queue,
    overdue_s,
    predicted_wait_s,
    retry_hint,
)
from tritonforge.sampling import SamplingParams, sample_next
from tritonforge.scheduler_prefill import PrefillSteps
from tritonforge.speculation import PromptLookup, Speculator
from tritonforge.text_stream import PendingText, StreamInterval, TextStream

# The ``finish_reason`` values of the generate convention.
FINISH_LENGTH, FINISH_STOP = "length", "stop"

StepFn = Callable[
    [np.ndarray, np.ndarray, np.ndarray, list[np.ndarray]], tuple[np.ndarray, list[np.ndarray]]
]


RECHECK_S = 0.1  # how often the queue is re-checked between steps (its refusals: within this)
DEFAULT_RANK = 2**31  # the queue rank of a sequence without a priority: behind every level


class CancelledError(ServingError):
    """The client cancelled the request or went away."""

    code = "CANCELLED"


OutputFn = Callable[["Generation", str, str | None], None]
"""``(sequence, text, finish_reason)``: a chunk; ``finish_reason`` set on the last one only."""
ErrorFn = Callable[["Generation", ServingError], None]


class RowProcessing(Protocol):
    """A row's logits processing (``tasks.generation.structured.RowChain``): ``process`` returns
    the logits to sample from (never changing its argument), ``accept`` sees the chosen token
    with the row's raw logits."""

    def process(self, logits: np.ndarray) -> np.ndarray: ...

    def accept(self, token: int, logits: np.ndarray) -> None: ...


@dataclass(eq=False)
class Generation:
    """One request being generated. ``on_output``/``on_error`` are called from the scheduler
    thread; exactly one of them ends the sequence (a chunk with a finish reason, or an error)."""

    prompt_ids: list[int]
    params: SamplingParams
    stream: TextStream
    on_output: OutputFn
    on_error: ErrorFn
    is_cancelled: Callable[[], bool] = lambda: False
    rng: np.random.Generator = field(default_factory=np.random.default_rng)
    tokens: list[int] = field(default_factory=list)
    finished: bool = False
    id: int = field(default_factory=itertools.count().__next__)
    queued_s: float = 0.0  # the scheduler's clock when it was queued
    processing: RowProcessing | None = None  # None: today's path, untouched
    admitted_s: float = 0.0  # ... when it got a slot (its prefill began)
    priority: int = 0  # 1 is the most urgent (Triton's convention); 0: the default, after all
    cache_salt: str = ""  # the prefix cache's namespace: only prompts of the same salt match
    pending: PendingText = field(default_factory=PendingText)  # decoded, not sent yet

    @property
    def rank(self) -> int:
        """Queue order: by priority, then arrival."""
        return queue_rank(self.priority)

    def finish(self, text: str, reason: str) -> None:
        if not self.finished:
            self.finished = True
            self.on_output(self, self.pending.take() + text, reason)

    def fail(self, error: ServingError) -> None:
        if not self.finished:
            self.finished = True
            self.on_error(self, error)


def queue_rank(priority: int) -> int:
    """The queue rank of a ``priority`` (1 first; 0: none, behind every level)."""
    return priority if priority > 0 else DEFAULT_RANK


class Scheduler(PrefillSteps):
    """In-flight batching over a step function. :meth:`submit` queues a sequence (bounded);
    each :meth:`step` admits waiting sequences into free slots (prefilled together), decodes one
    token for every running sequence, sends the new text, and retires finished or cancelled ones.
    :meth:`start` runs steps on a background thread until :meth:`close`."""

    def __init__(
        self,
        step_fn: StepFn,
        empty_past: Callable[[int], list[np.ndarray]],
        eos_ids: Sequence[int],
        max_running: int,
        max_queue: int,
        *,
        name: str,
        on_step: Callable[[int, int], None] | None = None,
        max_prefill_tokens: int = 2048,
        queue_timeout_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        layout: str = LEFT,
        kv_headroom: int = 0,
        rate: ServiceRate | None = None,
        stream_interval: StreamInterval | None = None,
        prefill_chunk_tokens: int | None = None,
        prefill_stall_row_tokens: int = 0,
        lookup: PromptLookup | None = None,
        prefix_cache_entries: int = 0,
        prefix_cache_tokens: int = 0,
    ) -> None:
        """``name``: the model serving (its config's name), which every message names.
        ``empty_past(batch)``: zero-length caches. ``on_step(running, waiting)`` is called
        after every step (metrics). Requests admitted together are prefilled in one call of at
        most ``max_prefill_tokens`` padded tokens (a long prompt is prefilled alone). A sequence
        whose predicted wait (:mod:`tritonforge.queue_forecast`, from ``rate``: measured here)
        is past ``admit_budget_s(queue_timeout_s)`` is refused at once with
        :class:`StageUnavailableError`, a queued one whose forecast grew past it within
        ``LATE_WINDOW_S`` of its arrival then, and one still waiting after
        ``overdue_s(queue_timeout_s)`` then (None: no forecast, it waits as long as it takes).
        ``layout``: the
        step's cache layout (``kv_batch.LEFT`` or ``RIGHT``, ``OrtDecoder.layout``);
        ``kv_headroom``: free columns a right-padded batch keeps for a step that writes in
        place (``OrtDecoder.kv_headroom``; 0: none). ``stream_interval``: tokens per streamed
        response by running rows (None: one token per response). ``prefill_chunk_tokens``: at
        most that many prompt tokens prefilled between two decode steps (chunked prefill,
        :mod:`tritonforge.prefill_plan`; None or 0: whole prefills, as before);
        ``prefill_stall_row_tokens``: the chunk by running rows
        (:func:`tritonforge.prefill_plan.iteration_chunk`; 0: a fixed chunk). ``lookup``:
        prompt-lookup speculation at one greedy row (:mod:`tritonforge.speculation`; None: off).
        ``prefix_cache_entries``: recent prompts whose cache a prompt starting the same way
        goes on from (:mod:`tritonforge.prefix_cache`; 0: off; right-padded layouts only, where
        a batch-1 chunk after a past is exact), holding at most ``prefix_cache_tokens`` prompt
        tokens together (0: no such bound)."""
        if queue_timeout_s is not None and queue_timeout_s <= 0:
            raise ValueError(f"queue_timeout_s must be > 0, got {queue_timeout_s}")
        self.name = name
        self.queue_timeout_s, self.clock = queue_timeout_s, clock
        self.max_prefill_tokens = max_prefill_tokens
        self.step_fn, self.empty_past = step_fn, empty_past
        self.on_step = on_step
        self.eos_ids = frozenset(eos_ids)
        self.max_running, self.max_queue = max_running, max_queue
        self.waiting: deque[Generation] = deque()
        self.layout, self.kv_headroom = layout, kv_headroom
        self.batch: Batch = new_batch(layout, kv_headroom)
        # prefilled (first token sent), waiting for their padding to fit the batch: (sequence,
        # its cached keys/values, their length, its last token)
        self.joining: deque[tuple[Generation, list[np.ndarray], int, int]] = deque()
        self.cond = threading.Condition()
        self.closed = False
        self.thread: threading.Thread | None = None
        self.steps = 0
        self.batch_sizes: list[int] = []
        self.rate = rate or ServiceRate()
        self.prefilling: list[Generation] = []  # admitted, in their prefill call
        self.prefill_ends_s = 0.0  # the clock when the prefill under way should end (forecast)
        self.stream_interval = stream_interval or StreamInterval()
        self.chunk_tokens = check_chunk_tokens(prefill_chunk_tokens)
        self.stall_row_tokens = check_stall_row_tokens(prefill_stall_row_tokens)
        self.partial: Partial | None = None  # a prompt prefilled in chunks, under way
        self.prefix = PrefixCache(
            prefix_cache_entries if layout == RIGHT else 0, prefix_cache_tokens
        )
        self.speculator = Speculator(lookup or PromptLookup())

    # -- producer side -------------------------------------------------------------------
    def check_admission(self, rank: int = DEFAULT_RANK) -> None:
        """:class:`StageUnavailableError` when a sequence of queue ``rank`` would be refused now
        (closed, queue full, a slot predicted past ``queue_timeout_s``): what :meth:`submit`
        checks, callable before the sequence is built, so that a refusal under a flood costs no
        chat template and no tokenization."""
        with self.cond:
            self._refuse_if_full(rank)

    def _refuse_if_full(self, rank: int) -> None:
        if self.closed:
            raise StageUnavailableError(f"{self.name}: the server is shutting down")
        if len(self.waiting) >= self.max_queue:
            raise StageUnavailableError(
                f"{self.name}: overloaded ({len(self.batch)} running, {len(self.waiting)} "
                f"queued, max_queue {self.max_queue}); retry later"
            )
        if self.queue_timeout_s is None:
            return
        wait_s, budget_s = self.predicted_wait_s(rank), admit_budget_s(self.queue_timeout_s)
        if wait_s > budget_s:
            raise StageUnavailableError(
                f"{self.name}: overloaded: a slot is about {wait_s:.1f} s away, past "
                f"{self._budget_words()} ({len(self._running_left())} running, "
                f"{len(self.waiting)} queued); {retry_hint(wait_s - budget_s)}"
            )

    def _budget_words(self) -> str:
        timeout_s = self.queue_timeout_s or 0.0
        return f"{admit_budget_s(timeout_s):.3g} s of queue_timeout_s {timeout_s:g} s"

    def submit(self, seq: Generation) -> None:
        """Queue ``seq``; :class:`StageUnavailableError` when the queue is full or closed, or
        its slot is predicted past ``admit_budget_s(queue_timeout_s)`` (:meth:`check_admission`)."""
        with self.cond:
            self._refuse_if_full(seq.rank)
            seq.queued_s = self.clock()
            ahead = sum(1 for s in self.waiting if s.rank <= seq.rank)
            self.waiting.insert(ahead, seq)  # the queue stays ordered by rank, then arrival
            self.cond.notify_all()  # the loop and the queue watcher

    def _running_left(self) -> list[int]:
        """Tokens each running (or joining) sequence may still decode."""
        # copies taken at once (the loop thread changes them without the lock)
        running = [
            *list(self.batch.rows),
            *(j[0] for j in list(self.joining)),
            *list(self.prefilling),
            *([p.seq] if (p := self.partial) is not None else []),
        ]
        return [s.params.max_new_tokens - len(s.tokens) for s in running]

    def predicted_wait_s(self, rank: int = DEFAULT_RANK) -> float:
        """Seconds a sequence of queue ``rank`` queued now would wait for a slot
        (:func:`predicted_wait_s`): behind the queued ones of the same or a more urgent rank."""
        queued = [
            Queued(s.params.max_new_tokens, len(s.prompt_ids))
            for s in self.waiting
            if s.rank <= rank
        ]
        return predicted_wait_s(
            self._running_left(), queued, self.max_running, self.rate, self._busy_s()
        )

    def _busy_s(self) -> float:
        """Seconds the prefill under way is still expected to take (0: none)."""
        under_way = self.prefilling or self.partial is not None
        return max(0.0, self.prefill_ends_s - self.clock()) if under_way else 0.0

    def load(self) -> tuple[int, int]:
        """``(running, waiting)``; running counts the prefilled sequences about to join (and
        one prefilled in chunks)."""
        with self.cond:
            partial = self.partial is not None
            return len(self.batch) + len(self.joining) + partial, len(self.waiting)

    # -- the loop ------------------------------------------------------------------------
    def start(self) -> None:
        self.thread = threading.Thread(
            target=self._loop, name=f"{self.name}-scheduler", daemon=True
        )
        self.thread.start()
        if self.queue_timeout_s is not None:
            threading.Thread(
                target=self._watch_queue, name=f"{self.name}-queue-watch", daemon=True
            ).start()

    def _watch_queue(self) -> None:
        """Re-check the queue every :data:`RECHECK_S` while the loop is inside a step (a
        prefill of a full batch takes seconds on a busy host): a sequence the forecast now puts
        past its deadline is refused within that, not after the step (:meth:`_expire_queued`)."""
        while True:
            with self.cond:
                while not self.closed and not self.waiting:
                    self.cond.wait()
                if self.closed:
                    return
            self._expire_queued()
            time.sleep(RECHECK_S)

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.closed and not self.waiting and not self.busy():
                    self.cond.wait()
                if self.closed:
                    return
            self.step()

    def close(self, reason: str | None = None) -> None:
        """Stop the loop; every queued and running sequence ends with UNAVAILABLE saying
        ``reason`` (by default that the server is shutting down)."""
        reason = reason or f"{self.name}: the server is shutting down"
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        if self.thread is not None:
            self.thread.join(timeout=30)
        with self.cond:
            pending = [*self.waiting, *(j[0] for j in self.joining), *self.batch.rows]
            pending += [self.partial.seq] if self.partial is not None else []
            self.partial = None
            self.waiting.clear()
            self.joining.clear()
        self.batch = new_batch(self.layout, self.kv_headroom)
        for seq in pending:
            seq.fail(StageUnavailableError(reason))

    def busy(self) -> bool:
        """Whether sequences are running, about to join or prefilled in chunks."""
        return bool(self.batch.rows or self.joining or self.partial is not None)

    def run_until_idle(self) -> None:
        """Step on the calling thread until nothing is queued or running (tests, export, bench)."""
        while self.waiting or self.busy():
            self.step()

    def step(self) -> None:
        try:
            self._retire_cancelled()
            self._expire_queued()
            self._admit()
            self._join()
            if self.batch.rows:
                self._decode()
        except Exception as e:  # a failed step ends the running sequences, never the loop
            import traceback

            traceback.print_exc()
            error = ServingError(f"{self.name}: decoder step failed ({type(e).__name__}: {e})")
            for seq in self.batch.rows:
                seq.fail(error)
            self.batch = new_batch(self.layout, self.kv_headroom)
        self.steps += 1
        if self.on_step is not None:
            self.on_step(*self.load())

    def _retire_cancelled(self) -> None:
        with self.cond:
            for seq in [s for s in self.waiting if s.is_cancelled()]:
                self.waiting.remove(seq)
                seq.fail(CancelledError(f"{self.name}: request cancelled"))
        cancelled = [j[0] for j in self.joining if j[0].is_cancelled()]
        if self.partial is not None and self.partial.seq.is_cancelled():
            cancelled.append(self.partial.seq)
            self.partial = None
        self.joining = deque(j for j in self.joining if all(j[0] is not c for c in cancelled))
        for seq in cancelled:
            seq.fail(CancelledError(f"{self.name}: request cancelled"))
        gone = [i for i, s in enumerate(self.batch.rows) if s.is_cancelled()]
        for i in gone:
            self.batch.rows[i].fail(CancelledError(f"{self.name}: request cancelled"))
        self.batch.remove(gone)

    def _expire_queued(self) -> None:
        """End the sequences that waited ``overdue_s(queue_timeout_s)`` for a slot (a clean
        refusal in bounded time instead of an answer after everything queued ahead of them), and
        those still in their late window that the forecast now puts past their deadline."""
        if self.queue_timeout_s is None:
            return
        expired: list[Generation] = []
        with self.cond:
            now = self.clock()
            overdue = overdue_s(self.queue_timeout_s)
            expired = [s for s in self.waiting if now - s.queued_s >= overdue]
            for seq in expired:  # by rank, so the oldest are not always first
                self.waiting.remove(seq)
            queued = [
                Queued(s.params.max_new_tokens, len(s.prompt_ids), now - s.queued_s)
                for s in self.waiting
            ]
            late = late_in_queue(
                self._running_left(),
                queued,
                self.max_running,
                self.rate,
                admit_budget_s(self.queue_timeout_s),
                self._busy_s(),
            )
            doomed = [self.waiting[i] for i in late]
            for seq in doomed:
                self.waiting.remove(seq)
            running, waiting = len(self.batch), len(self.waiting)
        load = f"({running} running, {waiting} queued)"
        why = f"queue_timeout_s {self.queue_timeout_s:g} s ({overdue:g} s: the forecast fell short)"
        for seq in expired:
            seq.fail(
                StageUnavailableError(
                    f"{self.name}: overloaded: queued longer than {why} {load}; retry later"
                )
            )
        for seq in doomed:
            seq.fail(
                StageUnavailableError(
                    f"{self.name}: overloaded: no slot predicted within {self._budget_words()} "
                    f"{load}; {retry_hint(1.0)}"
                )
            )

    def _join(self) -> None:
        """Move prefilled sequences into the running batch, in order, as soon as it takes them
        (``can_add``): a right-padded batch at once; a left-padded one when their padding can be
        a multiple of its ``align`` (the others wait for the width to grow, one column per
        decode step, so at most ``align - 1`` steps)."""
        still: deque[tuple[Generation, list[np.ndarray], int, int]] = deque()
        for seq, row, n, token in self.joining:
            if self.batch.can_add(n):
                self.batch.add(seq, row, n, token)
            else:
                still.append((seq, row, n, token))
        self.joining = still

    def _decode(self) -> None:
        """One token for every running sequence; its time is what each waits per token."""
        b = self.batch
        started_s, size = self.clock(), len(b)
        self.batch_sizes.append(len(b))
        if draft := self.speculator.draft(b):  # a lone greedy row, prompt lookup
            self.speculator.verify(b, self.step_fn, draft, self._emit)
        else:
            mask = b.step_mask()
            logits, presents = self.step_fn(b.last[:, None], mask, b.positions[:, None], b.past)
            b.advance(presents, mask)
            per_response = self.stream_interval.tokens(size)
            for i, seq in enumerate(b.rows):
                b.last[i] = self._emit(seq, logits[i, -1], per_response)
        b.remove([i for i, s in enumerate(b.rows) if s.finished])
        self.rate.observe_step(self.clock() - started_s, size)

    def _finished(self, seq: Generation) -> None:
        self.rate.observe_finish(len(seq.tokens), seq.params.max_new_tokens)

    def _emit(self, seq: Generation, logits: np.ndarray, per_response: int = 1) -> int:
        """Sample, record and stream one token (sent with the text pending once
        ``per_response`` tokens are: :class:`StreamInterval`); finish the sequence when it is
        done (its last response carries everything pending)."""
        if seq.processing is None:
            token = sample_next(logits, seq.params, seq.rng)
        else:
            token = sample_next(seq.processing.process(logits), seq.params, seq.rng)
            seq.processing.accept(token, logits)
        if token in self.eos_ids:
            seq.finish(seq.stream.finish(), FINISH_STOP)
            self._finished(seq)
            return token
        seq.tokens.append(token)
        chunk = seq.stream.push(token)
        if seq.stream.stopped:
            seq.finish(chunk, FINISH_STOP)
            self._finished(seq)
        elif len(seq.tokens) >= seq.params.max_new_tokens:
            seq.finish(chunk + seq.stream.finish(), FINISH_LENGTH)
            self._finished(seq)
        else:
            text = seq.pending.add(chunk, per_response)
            if text is not None:
                seq.on_output(seq, text, None)
        return token
