"""Chunked prefill (issue #35, ``prefill_plan``): a prompt prefilled ``prefill_chunk_tokens``
at a time between decode steps of the running rows gives the same tokens as its whole
prefill, never asks the decoder for several new tokens after a past at batch > 1 (ONNX
Runtime's GroupQueryAttention refuses that), and keeps cancellation, shutdown, failures and the
queue forecast as they were. Toy decoders from ``test_generation`` (one per cache layout)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest

from tests.unit.test_generation import (
    EOS,
    empty_past,
    make,
    toy_in_place_step,
    toy_right_step,
    toy_step,
)
from tritonforge.kv_batch import LEFT, RIGHT
from tritonforge.prefill_plan import (
    call_budget,
    check_chunk_tokens,
    check_stall_row_tokens,
    chunk_end,
    chunk_inputs,
    chunked,
    group_inputs,
    group_size,
    iteration_chunk,
)
from tritonforge.queue_forecast import ServiceRate
from tritonforge.scheduler import FINISH_LENGTH, CancelledError, Scheduler

PROMPTS = [[3, 1, 4], [1, 5, 9, 2, 6, 5, 3], [5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2], [2, 7] * 10]
STEPS = {LEFT: toy_step, RIGHT: toy_right_step, "in place": toy_in_place_step}


def test_the_plan_takes_whole_prompts_within_the_budget_and_chunks_a_longer_one() -> None:
    assert group_size([3, 3, 3, 9], free_slots=8, max_tokens=9) == 3  # 4 x 9 > 9
    assert group_size([3, 3, 3], free_slots=2, max_tokens=100) == 2  # the free slots
    assert group_size([12, 2], free_slots=8, max_tokens=8) == 1  # a longer first one alone
    assert group_size([2], free_slots=0, max_tokens=8) == 0
    assert call_budget(2048, None) == 2048 and call_budget(2048, 16) == 16
    assert check_chunk_tokens(0) is None and check_chunk_tokens(None) is None
    assert check_chunk_tokens(16) == 16
    with pytest.raises(ValueError, match="prefill_chunk_tokens"):
        check_chunk_tokens(-1)
    assert chunked(12, 8) and not chunked(8, 8) and not chunked(500, None)
    assert [chunk_end(d, 12, 5) for d in (0, 5, 10)] == [5, 10, 12]
    assert chunk_end(0, 12, None) == 12
    assert [chunk_end(d, 9, 4) for d in (0, 4, 7)] == [4, 7, 9]  # never a lone last token
    assert chunk_end(0, 2, 1) == 1  # unless the chunk is one token
    ids, mask, positions = chunk_inputs([7, 8, 9, 10, 11], 2, 4)
    assert ids.tolist() == [[9, 10]] and mask.tolist() == [[1, 1, 1, 1]]
    assert positions.tolist() == [[2, 3]]
    ids, mask, _ = group_inputs([[1, 2, 3], [4]])
    assert ids.tolist() == [[1, 2, 3], [4, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]


def test_the_chunk_grows_as_fewer_rows_run() -> None:
    assert iteration_chunk(0, 64, 1024) is None  # nothing decoding: whole prompts
    assert [iteration_chunk(n, 64, 1024) for n in (1, 8, 16, 32)] == [1024, 128, 64, 64]
    assert iteration_chunk(0, 64, 0) == 64 and iteration_chunk(3, 64, 0) == 64  # fixed chunk
    assert iteration_chunk(0, None, 1024) is None and iteration_chunk(5, None, 1024) is None
    assert check_stall_row_tokens(0) == 0 and check_stall_row_tokens(512) == 512
    with pytest.raises(ValueError, match="prefill_stall_row_tokens"):
        check_stall_row_tokens(-1)


def _logged(step: Callable[..., Any], log: list[tuple[str, int, int]]) -> Callable[..., Any]:
    """``step`` that records each call (``prefill``/``chunk``/``decode``, batch, new tokens)
    and refuses what GroupQueryAttention refuses: several new tokens after a past at batch > 1."""

    def logged(ids, mask, positions, past):  # type: ignore[no-untyped-def]
        b, s = ids.shape
        has_past = mask.shape[1] > s
        assert not (has_past and s > 1 and b > 1), "several new tokens after a past at batch > 1"
        log.append(("decode" if has_past and s == 1 else "chunk" if has_past else "prefill", b, s))
        return step(ids, mask, positions, past)

    return logged


def _run(
    layout: str,
    chunk_tokens: int | None,
    log: list[tuple[str, int, int]] | None = None,
    stall_row_tokens: int = 0,
) -> list[list[int]]:
    """Two short prompts start decoding; two steps later the others arrive (rows running)."""
    step = _logged(STEPS[layout], log if log is not None else [])
    sched = Scheduler(
        step, empty_past, [EOS], max_running=8, max_queue=8, name="generate",
        layout=LEFT if layout == LEFT else RIGHT, kv_headroom=4 if layout == "in place" else 0,
        prefill_chunk_tokens=chunk_tokens, prefill_stall_row_tokens=stall_row_tokens,
    )  # fmt: skip
    seqs = [make(p, 6) for p in PROMPTS]
    for s in seqs[:2]:
        sched.submit(s)
    sched.step()
    sched.step()
    for s in seqs[2:]:
        sched.submit(s)
    sched.run_until_idle()
    assert all(s.finished for s in seqs)
    return [s.tokens for s in seqs]


@pytest.mark.parametrize("layout", list(STEPS))
def test_chunked_prefill_gives_the_tokens_of_whole_prefills(layout: str) -> None:
    whole = _run(layout, None)
    assert all(len(t) == 6 for t in whole)
    for chunk_tokens in (1, 4, 5, 8, 64):
        assert _run(layout, chunk_tokens) == whole, chunk_tokens
    for chunk_tokens, stall_row_tokens in ((1, 1), (2, 8), (4, 12), (3, 30)):
        assert _run(layout, chunk_tokens, stall_row_tokens=stall_row_tokens) == whole


def test_the_chunk_follows_the_running_rows() -> None:
    """Stall budget 16 tokens x rows, chunk at least 3: with nothing decoding the first two
    prompts are prefilled whole in one call; with 2 rows decoding a chunk is 8 tokens, with 3
    rows 5, and when the first two rows end (1 running) the rest of the 20-token prompt."""
    log: list[tuple[str, int, int]] = []
    _run(RIGHT, 3, log, stall_row_tokens=16)
    assert [c for c in log if c[0] != "decode"] == [
        ("prefill", 2, 7),  # 0 rows running: the 3- and 7-token prompts together
        ("prefill", 1, 8),  # 2 running: the 12-token prompt's first 8 tokens
        ("chunk", 1, 4),  # ... its last 4
        ("prefill", 1, 5),  # 3 running: the 20-token prompt's first 5
        ("chunk", 1, 15),  # the first two rows ended (1 running): its last 15
    ]
    fixed: list[tuple[str, int, int]] = []
    _run(RIGHT, 3, fixed)  # a fixed chunk of 3, whatever runs
    assert fixed[0] == ("prefill", 1, 3)
    assert max(b * s for kind, b, s in fixed if kind != "decode") == 3


def test_running_rows_decode_between_the_chunks_of_a_new_prompt() -> None:
    log: list[tuple[str, int, int]] = []
    _run(RIGHT, 4, log)
    prefills = [c for c in log if c[0] != "decode"]
    assert max(b * s for _, b, s in prefills) <= 4  # never more than 4 prompt tokens per call
    assert [c for c in prefills if c[0] == "chunk"]  # the 20-token prompt went in chunks
    # between two prefill calls the running rows always decoded
    kinds = [c[0] for c in log]
    after_start = kinds[kinds.index("decode") :]
    pairs = itertools.pairwise(after_start)
    assert all("decode" in (a, b) for a, b in pairs), after_start
    # without chunking, the prompts that arrived while rows ran are prefilled in one call
    whole: list[tuple[str, int, int]] = []
    _run(RIGHT, None, whole)
    assert ("prefill", 2, 20) in whole


def test_a_prompt_cancelled_between_its_chunks_frees_its_slot() -> None:
    cancel = [False]
    out: list[Any] = []
    sched = Scheduler(
        toy_right_step, empty_past, [EOS], max_running=1, max_queue=4, name="generate",
        layout=RIGHT, prefill_chunk_tokens=3,
    )  # fmt: skip
    long = make(list(range(1, 10)), 4, out=out, cancelled=lambda: cancel[0])
    after = make([1, 2], 3, out=out)
    sched.submit(long)
    sched.submit(after)
    sched.step()  # its first chunk
    assert sched.partial is not None and sched.load() == (1, 1)
    cancel[0] = True
    sched.run_until_idle()
    errors = [e for i, e, r in out if i == long.id]
    assert len(errors) == 1 and isinstance(errors[0], CancelledError)
    assert sched.partial is None and [r for i, _, r in out if i == after.id][-1] == FINISH_LENGTH


def test_close_ends_a_prompt_under_way_and_a_failed_chunk_ends_only_its_prompt() -> None:
    out: list[Any] = []
    sched = Scheduler(
        toy_right_step, empty_past, [EOS], max_running=2, max_queue=4, name="generate",
        layout=RIGHT, prefill_chunk_tokens=3,
    )  # fmt: skip
    sched.submit(make(list(range(1, 10)), 4, out=out))
    sched.step()
    assert sched.busy()  # the loop keeps stepping while a prompt is under way
    sched.close()
    assert [r for *_, r in out] == ["error"] and "shutting down" in str(out[0][1])

    def failing(ids, mask, positions, past):  # type: ignore[no-untyped-def]
        if mask.shape[1] > ids.shape[1] > 1:
            raise RuntimeError("chunk refused")
        return toy_right_step(ids, mask, positions, past)

    out.clear()
    sched = Scheduler(
        failing, empty_past, [EOS], max_running=2, max_queue=4, name="generate", layout=RIGHT,
        prefill_chunk_tokens=3,
    )  # fmt: skip
    short, long = make([1, 2], 5, out=out), make(list(range(1, 10)), 4, out=out)
    sched.submit(short)
    sched.step()
    sched.submit(long)
    sched.run_until_idle()
    assert [r for i, _, r in out if i == long.id] == ["error"]
    assert "prefill failed" in str(next(e for i, e, _ in out if i == long.id))
    assert [r for i, _, r in out if i == short.id][-1] == FINISH_LENGTH


def test_the_forecast_learns_per_chunk_token_and_counts_a_prompt_under_way() -> None:
    """Each chunk teaches the seconds per prompt token (its own tokens, batch 1); a prompt under
    way holds a slot in the forecast and its remaining prefill keeps the engine busy."""
    now = [0.0]

    def costly(ids, mask, positions, past):  # type: ignore[no-untyped-def]
        prefill = ids.shape[1] > 1 or past[0].shape[2] == 0
        now[0] += 0.01 * ids.size if prefill else 0.1
        return toy_right_step(ids, mask, positions, past)

    rate = ServiceRate(alpha=1.0)
    sched = Scheduler(
        costly, empty_past, [EOS], max_running=1, max_queue=4, name="generate", layout=RIGHT,
        clock=lambda: now[0], rate=rate, prefill_chunk_tokens=4,
    )  # fmt: skip
    sched.submit(make(list(range(1, 11)), 8))
    sched.step()
    assert rate.prompt_token_s == pytest.approx(0.01)
    assert sched._running_left() == [8]  # the prompt under way holds the only slot
    sched.prefill_ends_s = now[0] + 0.06  # as a chunk sets it: the 6 tokens left
    assert sched._busy_s() == pytest.approx(0.06)
    assert sched.predicted_wait_s() > 0.06


def test_the_warm_up_is_never_refused_by_its_own_forecast(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen loading three generate models at load 12: the warm-up's full batch was refused by
    the queue forecast (its first prefill measured slow), so the model failed to load. The
    warm-up is what measures the forecast: it never refuses itself; refusals come back after."""
    import json

    from tokenizers import Tokenizer, models

    from tritonforge import generate_engine
    from tritonforge.errors import ModelConfigError, StageUnavailableError
    from tritonforge.modelconfig import ModelConfig

    Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]")).save(
        str(tmp_path / "tokenizer.json")
    )
    (tmp_path / "generation.json").write_text(json.dumps({"eos_token_ids": [EOS]}))
    monkeypatch.setattr(generate_engine, "verify_sidecar", lambda *_, **__: None)
    decoder = type(
        "D",
        (),
        {
            "empty_past": staticmethod(empty_past),
            "layout": RIGHT,
            "kv_headroom": 0,
            "__call__": staticmethod(toy_right_step),
        },
    )
    monkeypatch.setattr(generate_engine, "OrtDecoder", lambda *_: decoder())
    params = {
        "decoder_file": "decoder.onnx", "tokenizer_file": "tokenizer.json",
        "generation_file": "generation.json", "max_prompt_tokens": "8",
        "max_new_tokens_limit": "16", "default_max_new_tokens": "2", "max_running": "4",
        "max_queue": "8", "queue_timeout_s": "10", "prefill_chunk_tokens": "4",
        "prefill_stall_row_tokens": "12",
    }  # fmt: skip
    engine = generate_engine.GenerateEngine(
        ModelConfig.from_json({"name": "g", "parameters": params}), tmp_path
    )
    assert engine.scheduler.chunk_tokens == 4 and engine.scheduler.stall_row_tokens == 12
    with pytest.raises(ModelConfigError, match="prefill_stall_row_tokens"):
        generate_engine.GenerateEngine(
            ModelConfig.from_json(
                {"name": "g", "parameters": {**params, "prefill_stall_row_tokens": "-1"}}
            ),
            tmp_path,
        )
    engine.scheduler.rate.prompt_token_s = 100.0  # a busy host's first prefills
    engine.warmup("a")
    assert engine.scheduler.queue_timeout_s == 10.0
    engine.scheduler.rate.prompt_token_s = 100.0
    engine.scheduler.submit(make([1], 2))
    with pytest.raises(StageUnavailableError, match="overloaded"):
        engine.scheduler.submit(make([1], 2))


def test_row_processing_sees_the_same_logits_chunked_or_whole() -> None:
    """Logprobs and grammars (``Generation.processing``) see every token's raw logits: the
    first token's come from the last chunk, the same as the whole prefill's."""

    class Recording:
        def __init__(self) -> None:
            self.seen: list[tuple[int, list[float]]] = []

        def process(self, logits: Any) -> Any:
            return logits

        def accept(self, token: int, logits: Any) -> None:
            self.seen.append((token, logits.tolist()))

    def run(chunk_tokens: int | None) -> list[list[tuple[int, list[float]]]]:
        sched = Scheduler(
            toy_right_step, empty_past, [EOS], max_running=4, max_queue=4, name="generate",
            layout=RIGHT, prefill_chunk_tokens=chunk_tokens,
        )  # fmt: skip
        seqs = [make(p, 4) for p in PROMPTS]
        for seq in seqs:
            seq.processing = Recording()
            sched.submit(seq)
        sched.run_until_idle()
        return [s.processing.seen for s in seqs]  # type: ignore[union-attr]

    whole = run(None)
    assert [len(s) for s in whole] == [4] * len(PROMPTS)
    assert run(3) == whole
