"""Text generation as pure, tested parts: sampling parameters, next-token sampling, streamed
detokenization with stop strings, and the in-flight (iteration-level) batch scheduler.

The ``generate`` Triton model is a thin loop over these; the export's fidelity check and the
in-process benchmark drive the same :class:`Scheduler` with an ONNX Runtime step function, so the
served code path is the verified one.

The decoder contract (see ``export.decoder.module``)::

    step(input_ids [b, s], attention_mask [b, past + s], position_ids [b, s], past)
        -> (logits [b, s, vocab], presents)      # past/presents: 2 * layers arrays [b, h, t, d]
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from tritonforge.errors import InvalidInputError, ServingError, StageUnavailableError

# Field names of the Triton generate convention (vLLM / TensorRT-LLM backends, genai-perf).
TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"
FINISH_REASON = "finish_reason"
SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "chat_template")
FINISH_LENGTH, FINISH_STOP = "length", "stop"
# The request parameter that pins a decoder variant (each variant is its own model; a request
# naming another variant than the model serves is refused, never answered by another decoder).
VARIANT_PARAMETER = "variant"

StepFn = Callable[
    [np.ndarray, np.ndarray, np.ndarray, list[np.ndarray]], tuple[np.ndarray, list[np.ndarray]]
]


class CancelledError(ServingError):
    """The client cancelled the request or went away."""

    code = "CANCELLED"


@dataclass(frozen=True)
class GenerationLimits:
    max_prompt_tokens: int
    max_new_tokens_limit: int
    default_max_new_tokens: int


@dataclass(frozen=True)
class SamplingParams:
    """Per-request generation settings. ``temperature == 0`` is greedy decoding."""

    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k filter
    seed: int | None = None
    stop: tuple[str, ...] = ()
    chat_template: bool = True


def _scalar(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        if value.size != 1:
            raise ValueError(f"expected one value, got shape {list(value.shape)}")
        value = value.reshape(-1)[0]
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    if isinstance(value, np.generic):
        value = value.item()
    return value


def _stops(value: Any) -> tuple[str, ...]:
    if isinstance(value, np.ndarray):
        items = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in value.reshape(-1)]
    elif isinstance(value, str):
        items = json.loads(value) if value.startswith("[") else [value]
    elif isinstance(value, list | tuple):
        items = [str(v) for v in value]
    else:
        raise ValueError("a string or a list of strings")
    if any(not s for s in items):
        raise ValueError("stop strings must not be empty")
    return tuple(items)


def _bool(value: Any) -> bool:
    if isinstance(value, str):
        if value.lower() not in ("true", "false", "1", "0"):
            raise ValueError("true or false")
        return value.lower() in ("true", "1")
    return bool(value)


def parse_sampling(values: Mapping[str, Any], limits: GenerationLimits) -> SamplingParams:
    """Sampling parameters from request tensors/parameters (names in :data:`SAMPLING_FIELDS`;
    ``max_new_tokens`` is accepted as an alias of ``max_tokens``). Every problem is collected and
    raised as one :class:`InvalidInputError` naming each field."""
    problems: list[str] = []
    out: dict[str, Any] = {"max_new_tokens": limits.default_max_new_tokens}

    def take(
        name: str, convert: Callable[[Any], Any], check: Callable[[Any], bool], rule: str
    ) -> Any:
        if name not in values or values[name] is None:
            return None
        try:
            raw = values[name] if name == "stop" else _scalar(values[name])
            value = convert(raw)
        except (ValueError, TypeError) as e:
            problems.append(f"{name}: {e}")
            return None
        if not check(value):
            problems.append(f"{name} must be {rule}, got {value!r}")
            return None
        return value

    limit = limits.max_new_tokens_limit
    for key in ("max_tokens", "max_new_tokens"):
        n = take(key, int, lambda v: 1 <= v <= limit, f"in [1, {limit}]")
        if n is not None:
            out["max_new_tokens"] = n
    specs: dict[str, tuple[Callable[[Any], Any], Callable[[Any], bool], str]] = {
        "temperature": (float, lambda v: 0.0 <= v <= 10.0, "in [0, 10]"),
        "top_p": (float, lambda v: 0.0 < v <= 1.0, "in (0, 1]"),
        "top_k": (int, lambda v: v >= 0, ">= 0"),
        "seed": (int, lambda v: 0 <= v < 2**64, "in [0, 2**64)"),
        "stop": (_stops, lambda v: len(v) <= 8 and all(len(s) <= 64 for s in v), "<= 8 x 64"),
        "chat_template": (_bool, lambda v: True, "a boolean"),
    }
    for name, (convert, check, rule) in specs.items():
        value = take(name, convert, check, rule)
        if value is not None:
            out[name] = value
    if problems:
        raise InvalidInputError("invalid sampling parameters: " + "; ".join(problems))
    return SamplingParams(**out)


def sample_next(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """The next token id from one row of logits: argmax when greedy, else temperature, top-k and
    nucleus (top-p) filtering, sampled with ``rng`` (a fixed seed reproduces the draw)."""
    if params.temperature == 0.0:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / params.temperature
    order = np.argsort(-scaled, kind="stable")
    if params.top_k > 0:
        order = order[: params.top_k]
    kept = scaled[order]
    probs = np.exp(kept - kept.max())
    probs /= probs.sum()
    if params.top_p < 1.0:
        cut = int(np.searchsorted(np.cumsum(probs), params.top_p)) + 1
        order, probs = order[:cut], probs[:cut] / probs[:cut].sum()
    return int(order[rng.choice(len(order), p=probs)])


def stop_split(text: str, stops: Sequence[str]) -> tuple[int, bool]:
    """``(end, stopped)``: ``text[:end]`` is safe to emit. ``stopped``: a stop string occurs and
    ``end`` is where the earliest one starts; otherwise ``end`` holds back the longest tail that
    could still grow into a stop string."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    if hits:
        return min(hits), True
    hold = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:n]):
                hold = max(hold, n)
                break
    return len(text) - hold, False


class Detokenizer(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class TextStream:
    """Generated token ids -> text chunks. Each :meth:`push` returns the new text that is safe to
    send: no partial UTF-8 character (held back while the decode ends in U+FFFD) and no prefix of
    a stop string. ``stopped`` becomes true once a stop string appears (it is not emitted)."""

    def __init__(self, tokenizer: Detokenizer, stops: Sequence[str] = ()) -> None:
        self.tokenizer, self.stops = tokenizer, tuple(stops)
        self.ids: list[int] = []
        self.sent = 0
        self.stopped = False

    def _text(self) -> str:
        return self.tokenizer.decode(self.ids, skip_special_tokens=True)

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self._text()
        if text.endswith("\ufffd"):
            return ""
        end, self.stopped = stop_split(text, self.stops)
        return self._advance(text, end)

    def finish(self) -> str:
        """The held-back rest (at the end of generation nothing can complete a stop string)."""
        if self.stopped:
            return ""
        text = self._text()
        end, self.stopped = stop_split(text, self.stops)
        return self._advance(text, end if self.stopped else len(text))

    def _advance(self, text: str, end: int) -> str:
        chunk = text[self.sent : max(end, self.sent)]
        self.sent = max(end, self.sent)
        return chunk


OutputFn = Callable[["Generation", str, str | None], None]
"""``(sequence, text, finish_reason)``: a chunk; ``finish_reason`` set on the last one only."""
ErrorFn = Callable[["Generation", ServingError], None]


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

    def finish(self, text: str, reason: str) -> None:
        if not self.finished:
            self.finished = True
            self.on_output(self, text, reason)

    def fail(self, error: ServingError) -> None:
        if not self.finished:
            self.finished = True
            self.on_error(self, error)


@dataclass
class KVBatch:
    """The running batch: past keys/values left-padded to a common length, a mask over them,
    each row's next position and last token. Rows join (:meth:`add`) and leave (:meth:`remove`)
    between steps; columns masked in every row are trimmed."""

    rows: list[Generation] = field(default_factory=list)
    past: list[np.ndarray] = field(default_factory=list)
    mask: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    positions: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    last: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, seq: Generation, presents: list[np.ndarray], length: int, token: int) -> None:
        """Join a prefilled row (``presents``: batch 1, ``length`` columns, all valid)."""
        if not self.rows:
            self.rows, self.past = [seq], list(presents)
            self.mask = np.ones((1, length), np.int64)
            self.positions = np.array([length], np.int64)
            self.last = np.array([token], np.int64)
            return
        width = self.mask.shape[1]
        grow, pad = max(0, length - width), max(0, width - length)
        row_mask = np.concatenate([np.zeros((1, pad), np.int64), np.ones((1, length), np.int64)], 1)
        self.mask = np.concatenate([np.pad(self.mask, ((0, 0), (grow, 0))), row_mask], 0)
        spec = ((0, 0), (0, 0), (grow, 0), (0, 0))
        row_spec = ((0, 0), (0, 0), (pad, 0), (0, 0))
        self.past = [
            np.concatenate([np.pad(p, spec), np.pad(r, row_spec)], 0)
            for p, r in zip(self.past, presents, strict=True)
        ]
        self.rows.append(seq)
        self.positions = np.append(self.positions, length)
        self.last = np.append(self.last, token)

    def remove(self, leaving: Sequence[int]) -> None:
        if not leaving:
            return
        keep = [i for i in range(len(self.rows)) if i not in set(leaving)]
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.past, self.mask = [], np.zeros((0, 0), np.int64)
            self.positions = self.last = np.zeros(0, np.int64)
            return
        self.mask, self.positions, self.last = (
            self.mask[keep],
            self.positions[keep],
            self.last[keep],
        )
        start = int(np.argmax(self.mask.any(0)))  # first column some row still attends
        self.mask = self.mask[:, start:]
        self.past = [np.ascontiguousarray(p[keep][:, :, start:]) for p in self.past]


class Scheduler:
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
        on_step: Callable[[int, int], None] | None = None,
        max_prefill_tokens: int = 2048,
        queue_timeout_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``empty_past(batch)``: zero-length caches. ``on_step(running, waiting)`` is called
        after every step (metrics). Requests admitted together are prefilled in one call of at
        most ``max_prefill_tokens`` padded tokens (a long prompt is prefilled alone). A sequence
        still waiting for a slot ``queue_timeout_s`` after :meth:`submit` ends with
        :class:`StageUnavailableError` (None: it waits as long as it takes)."""
        if queue_timeout_s is not None and queue_timeout_s <= 0:
            raise ValueError(f"queue_timeout_s must be > 0, got {queue_timeout_s}")
        self.queue_timeout_s, self.clock = queue_timeout_s, clock
        self.max_prefill_tokens = max_prefill_tokens
        self.step_fn, self.empty_past = step_fn, empty_past
        self.on_step = on_step
        self.eos_ids = frozenset(eos_ids)
        self.max_running, self.max_queue = max_running, max_queue
        self.waiting: deque[Generation] = deque()
        self.batch = KVBatch()
        self.cond = threading.Condition()
        self.closed = False
        self.thread: threading.Thread | None = None
        self.steps = 0
        self.batch_sizes: list[int] = []

    # -- producer side -------------------------------------------------------------------
    def submit(self, seq: Generation) -> None:
        """Queue ``seq``; :class:`StageUnavailableError` when the queue is full or closed."""
        with self.cond:
            if self.closed:
                raise StageUnavailableError("generate: the server is shutting down")
            if len(self.waiting) >= self.max_queue:
                raise StageUnavailableError(
                    f"generate: overloaded ({len(self.batch)} running, {len(self.waiting)} "
                    f"queued, max_queue {self.max_queue}); retry later"
                )
            seq.queued_s = self.clock()
            self.waiting.append(seq)
            self.cond.notify()

    def load(self) -> tuple[int, int]:
        """``(running, waiting)``."""
        with self.cond:
            return len(self.batch), len(self.waiting)

    # -- the loop ------------------------------------------------------------------------
    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name="generate-scheduler", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.closed and not self.waiting and not self.batch.rows:
                    self.cond.wait()
                if self.closed:
                    return
            self.step()

    def close(self, reason: str = "generate: the server is shutting down") -> None:
        """Stop the loop; every queued and running sequence ends with UNAVAILABLE."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        if self.thread is not None:
            self.thread.join(timeout=30)
        with self.cond:
            pending = [*self.waiting, *self.batch.rows]
            self.waiting.clear()
        self.batch = KVBatch()
        for seq in pending:
            seq.fail(StageUnavailableError(reason))

    def run_until_idle(self) -> None:
        """Step on the calling thread until nothing is queued or running (tests, export, bench)."""
        while self.waiting or self.batch.rows:
            self.step()

    def step(self) -> None:
        try:
            self._retire_cancelled()
            self._expire_queued()
            self._admit()
            if self.batch.rows:
                self._decode()
        except Exception as e:  # a failed step ends the running sequences, never the loop
            import traceback

            traceback.print_exc()
            error = ServingError(f"generate: decoder step failed ({type(e).__name__}: {e})")
            for seq in self.batch.rows:
                seq.fail(error)
            self.batch = KVBatch()
        self.steps += 1
        if self.on_step is not None:
            self.on_step(*self.load())

    def _retire_cancelled(self) -> None:
        with self.cond:
            for seq in [s for s in self.waiting if s.is_cancelled()]:
                self.waiting.remove(seq)
                seq.fail(CancelledError("generate: request cancelled"))
        gone = [i for i, s in enumerate(self.batch.rows) if s.is_cancelled()]
        for i in gone:
            self.batch.rows[i].fail(CancelledError("generate: request cancelled"))
        self.batch.remove(gone)

    def _expire_queued(self) -> None:
        """End the sequences that waited ``queue_timeout_s`` for a slot: a clean refusal in
        bounded time instead of an answer after everything queued ahead of them."""
        if self.queue_timeout_s is None:
            return
        expired: list[Generation] = []
        with self.cond:
            now = self.clock()
            while self.waiting and now - self.waiting[0].queued_s >= self.queue_timeout_s:
                expired.append(self.waiting.popleft())  # FIFO: the oldest are first
            running, queued = len(self.batch), len(self.waiting)
        for seq in expired:
            seq.fail(
                StageUnavailableError(
                    f"generate: overloaded: queued longer than queue_timeout_s {self.queue_timeout_s:g} s "
                    f"({running} running, {queued} queued); retry later"
                )
            )

    def _admit(self) -> None:
        """Prefill the sequences that fit (free slots, ``max_prefill_tokens`` padded tokens) in
        one left-padded call, emit each one's first token, and join them to the batch."""
        admitted: list[Generation] = []
        with self.cond:
            while self.waiting and len(self.batch) + len(admitted) < self.max_running:
                width = max(len(s.prompt_ids) for s in [*admitted, self.waiting[0]])
                if admitted and width * (len(admitted) + 1) > self.max_prefill_tokens:
                    break
                admitted.append(self.waiting.popleft())
        if not admitted:
            return
        lengths = [len(s.prompt_ids) for s in admitted]
        width = max(lengths)
        ids = np.zeros((len(admitted), width), np.int64)
        mask = np.zeros_like(ids)
        positions = np.zeros_like(ids)
        for i, (seq, n) in enumerate(zip(admitted, lengths, strict=True)):
            ids[i, width - n :] = seq.prompt_ids
            mask[i, width - n :] = 1
            positions[i, width - n :] = np.arange(n)
        try:
            logits, presents = self.step_fn(ids, mask, positions, self.empty_past(len(admitted)))
        except Exception as e:
            for seq in admitted:
                seq.fail(ServingError(f"generate: prefill failed ({type(e).__name__}: {e})"))
            return
        for i, (seq, n) in enumerate(zip(admitted, lengths, strict=True)):
            token = self._emit(seq, logits[i, -1])
            if not seq.finished:
                row = [p[i : i + 1, :, width - n :] for p in presents]
                self.batch.add(seq, row, n, token)

    def _decode(self) -> None:
        b = self.batch
        mask = np.concatenate([b.mask, np.ones((len(b), 1), np.int64)], 1)
        logits, presents = self.step_fn(b.last[:, None], mask, b.positions[:, None], b.past)
        b.past, b.mask = presents, mask
        b.positions = b.positions + 1
        self.batch_sizes.append(len(b))
        for i, seq in enumerate(b.rows):
            b.last[i] = self._emit(seq, logits[i, -1])
        b.remove([i for i, s in enumerate(b.rows) if s.finished])

    def _emit(self, seq: Generation, logits: np.ndarray) -> int:
        """Sample, record and stream one token; finish the sequence when it is done."""
        token = sample_next(logits, seq.params, seq.rng)
        if token in self.eos_ids:
            seq.finish(seq.stream.finish(), FINISH_STOP)
            return token
        seq.tokens.append(token)
        chunk = seq.stream.push(token)
        if seq.stream.stopped:
            seq.finish(chunk, FINISH_STOP)
        elif len(seq.tokens) >= seq.params.max_new_tokens:
            seq.finish(chunk + seq.stream.finish(), FINISH_LENGTH)
        elif chunk:
            seq.on_output(seq, chunk, None)
        return token


def check_variant(requested: Any, served: str, model: str) -> None:
    """A request's ``variant`` parameter (None: not pinned) against the variant ``model`` serves;
    :class:`InvalidInputError` naming the field on a mismatch."""
    if requested is None:
        return
    requested = requested.decode() if isinstance(requested, bytes) else str(requested)
    if requested != served:
        raise InvalidInputError(
            f"{VARIANT_PARAMETER}: model {model!r} serves variant {served!r}, not "
            f"{requested!r}; send the request to the model whose tritonforge.variant is "
            f"{requested!r}"
        )


def render_prompt(text: str, template: str | None, use_template: bool) -> str:
    """The prompt the model sees: ``text`` as one user message through the chat template (a
    Jinja template, rendered sandboxed as Hugging Face does), or ``text`` as is."""
    if not use_template or not template:
        return text
    return render_chat([{"role": "user", "content": text}], template)


def render_chat(messages: Sequence[Mapping[str, str]], template: str) -> str:
    """``messages`` (``role``/``content``) through the chat template with the generation prompt
    appended (the OpenAI ``/v1/chat/completions`` path; one user message is :func:`render_prompt`)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(
        messages=[dict(m) for m in messages], add_generation_prompt=True
    )
