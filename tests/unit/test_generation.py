"""Pure generation parts: sampling parameters, sampling, stop strings, streamed text, the
left- and right-padded KV batches and the in-flight scheduler (driven by small mask-honouring toy
decoders, one per cache layout)."""

from __future__ import annotations

import numpy as np
import pytest

from tritonforge.errors import InvalidInputError, StageUnavailableError
from tritonforge.generation import render_prompt
from tritonforge.kv_batch import RIGHT, KVBatch, RightKVBatch, new_batch
from tritonforge.sampling import GenerationLimits, SamplingParams, parse_sampling, sample_next
from tritonforge.scheduler import FINISH_LENGTH, FINISH_STOP, Generation, Scheduler
from tritonforge.text_stream import TextStream, stop_split

LIMITS = GenerationLimits(max_prompt_tokens=64, max_new_tokens_limit=32, default_max_new_tokens=8)
VOCAB = 11
EOS = 0


class CharTokenizer:
    """id i -> chr(ord('a') + i); id 10 decodes to a lone high byte (an incomplete character)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        text = "".join("\ufffd" if i == 10 else chr(ord("a") + i) for i in ids)
        return text


def toy_step(ids, mask, positions, past):
    """A 'decoder' whose next token depends on exactly the attended tokens and the position:
    (sum of attended token ids + count of attended columns + position) mod 9 + 1 (never EOS
    unless a row attends exactly what makes it 0 — we avoid that by the +1)."""
    new = (ids + 1).astype(np.float32)[:, None, :, None]  # stored values: token + 1
    present = [np.concatenate([past[0], new], 2)]
    attended = present[0][:, 0, :, 0] * mask  # [b, total]
    b, s = ids.shape
    logits = np.zeros((b, s, VOCAB), np.float32)
    total = mask.shape[1]
    for i in range(b):
        for j in range(s):
            col = total - s + j
            value = attended[i, : col + 1].sum() + mask[i, : col + 1].sum() + positions[i, j]
            logits[i, j, int(value) % 9 + 1] = 1.0
    return logits, present


def toy_right_step(ids, mask, positions, past):
    """A right-padded 'decoder' as ONNX Runtime's GroupQueryAttention: no positions (ignored),
    row i's length is ``mask[i].sum() - s`` for a decode step (0 for a prefill), its new tokens
    are stored from that column, and the next token depends on the attended values weighted by
    their column (a row's columns must not move) and the derived position."""
    b, s = ids.shape
    total = mask.shape[1]
    lengths = mask.sum(1) - s if past[0].shape[2] else np.zeros(b, np.int64)
    present = [np.zeros((b, 1, total, 1), np.float32)]
    present[0][:, :, : past[0].shape[2]] = past[0]
    logits = np.zeros((b, s, VOCAB), np.float32)
    for i in range(b):
        n = int(lengths[i])
        present[0][i, 0, n : n + s, 0] = ids[i] + 1
        for j in range(s):
            cols = n + j + 1
            value = (present[0][i, 0, :cols, 0] * np.arange(1, cols + 1)).sum() + n + j
            logits[i, j, int(value) % 9 + 1] = 1.0
    return logits, present


IN_PLACE_CALLS: list[int] = []


def toy_in_place_step(ids, mask, positions, past):
    """``toy_right_step`` that writes a decode step's new column into ``past`` when it has room
    and returns it (as ``OrtDecoder.in_place``: GroupQueryAttention with a shared buffer)."""
    if ids.shape[1] == 1 and past[0].shape[2] >= mask.shape[1]:
        valid = [p[:, :, : mask.shape[1] - 1] for p in past]
        logits, _ = toy_right_step(ids, mask, positions, valid)
        for i, n in enumerate(mask.sum(1) - 1):
            past[0][i, 0, n, 0] = ids[i, 0] + 1
        IN_PLACE_CALLS.append(past[0].shape[2])
        return logits, past
    return toy_right_step(ids, mask, positions, past)


def empty_past(batch: int = 1):
    return [np.zeros((batch, 1, 0, 1), np.float32)]


def make(prompt, max_new=5, stop=(), out=None, cancelled=lambda: False):
    out = out if out is not None else []
    return Generation(
        list(prompt),
        SamplingParams(max_new_tokens=max_new, stop=tuple(stop)),
        TextStream(CharTokenizer(), stop),
        on_output=lambda s, text, reason: out.append((s.id, text, reason)),
        on_error=lambda s, e: out.append((s.id, e, "error")),
        is_cancelled=cancelled,
    )


def test_parse_sampling_defaults_aliases_and_every_problem_named():
    assert parse_sampling({}, LIMITS).max_new_tokens == 8
    p = parse_sampling(
        {"max_tokens": np.array([4], np.int32), "temperature": "0.5", "stop": ["\n", "END"]},
        LIMITS,
    )
    assert (p.max_new_tokens, p.temperature, p.stop) == (4, 0.5, ("\n", "END"))
    assert parse_sampling({"max_new_tokens": 3}, LIMITS).max_new_tokens == 3
    assert parse_sampling({"chat_template": "false"}, LIMITS).chat_template is False
    with pytest.raises(InvalidInputError) as e:
        parse_sampling({"max_tokens": 33, "top_p": 0, "temperature": "hot", "stop": [""]}, LIMITS)
    for field in ("max_tokens", "top_p", "temperature", "stop"):
        assert field in str(e.value)


def test_sampling_greedy_seeded_top_k_top_p():
    logits = np.array([0.1, 2.0, 1.9, -1.0])
    greedy = SamplingParams(max_new_tokens=1)
    assert sample_next(logits, greedy, np.random.default_rng(0)) == 1
    hot = SamplingParams(max_new_tokens=1, temperature=1.0)
    draws = [sample_next(logits, hot, np.random.default_rng(s)) for s in range(200)]
    again = [sample_next(logits, hot, np.random.default_rng(s)) for s in range(200)]
    assert draws == again and len(set(draws)) > 2  # seeded: reproducible, and it does sample
    top1 = SamplingParams(max_new_tokens=1, temperature=1.0, top_k=1)
    assert {sample_next(logits, top1, np.random.default_rng(s)) for s in range(50)} == {1}
    nucleus = SamplingParams(max_new_tokens=1, temperature=1.0, top_p=0.6)
    assert {sample_next(logits, nucleus, np.random.default_rng(s)) for s in range(100)} == {1, 2}


def test_stop_split_holds_back_partial_stops():
    assert stop_split("hello wor", ["world"]) == (6, False)
    assert stop_split("hello world!", ["world"]) == (6, True)
    assert stop_split("abc", []) == (3, False)
    assert stop_split("a\nb", ["\n", "b"]) == (1, True)


def test_text_stream_never_splits_a_character_or_leaks_a_stop():
    s = TextStream(CharTokenizer(), ("cd",))
    assert s.push(0) == "a"
    assert s.push(10) == ""  # incomplete character held back
    assert s.push(1) == "\ufffdb"
    assert s.push(2) == ""  # "c" could start "cd"
    assert s.push(3) == "" and s.stopped  # "cd" is a stop: never emitted
    t = TextStream(CharTokenizer(), ("cd",))
    t.push(2)
    assert t.finish() == "c"  # at the end the held-back tail is released


def test_kv_batch_left_pads_joins_and_trims():
    batch = KVBatch(align=1)
    row = lambda n, v: [np.full((1, 1, n, 1), v, np.float32)]  # noqa: E731
    a, b = make([1]), make([2])
    batch.add(a, row(2, 1.0), 2, 5)
    batch.add(b, row(4, 2.0), 4, 6)
    assert batch.mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    assert batch.past[0][0, 0, :, 0].tolist() == [0, 0, 1, 1]
    assert batch.positions.tolist() == [2, 4] and batch.last.tolist() == [5, 6]
    batch.remove([1])
    assert batch.mask.tolist() == [[1, 1]]  # columns nobody attends are trimmed
    assert batch.past[0].shape == (1, 1, 2, 1) and batch.rows == [a]
    batch.remove([0])
    assert len(batch) == 0


def test_kv_batch_keeps_every_rows_padding_a_multiple_of_align():
    batch = KVBatch(align=4)
    row = lambda n: [np.ones((1, 1, n, 1), np.float32)]  # noqa: E731
    batch.add(make([1]), row(3), 3, 5)
    assert not batch.can_add(5) and not batch.can_add(2)
    with pytest.raises(ValueError, match="multiple of 4"):
        batch.add(make([2]), row(5), 5, 6)
    batch.add(make([2]), row(7), 7, 6)  # the batch grows by 4: both paddings stay aligned
    batch.add(make([3]), row(3), 3, 7)
    assert (batch.mask == 0).sum(1).tolist() == [4, 0, 4]
    batch.remove([1])  # the 4 columns nobody attends any more are trimmed
    assert batch.mask.tolist() == [[1, 1, 1], [1, 1, 1]]


def test_right_kv_batch_joins_at_once_pads_right_and_trims():
    batch = new_batch(RIGHT)
    assert isinstance(batch, RightKVBatch)
    row = lambda n, v: [np.full((1, 1, n, 1), v, np.float32)]  # noqa: E731
    a, b, c = make([1]), make([2]), make([3])
    batch.add(a, row(2, 1.0), 2, 5)
    assert all(batch.can_add(n) for n in range(1, 9))  # no alignment wait
    batch.add(b, row(4, 2.0), 4, 6)
    batch.add(c, row(3, 3.0), 3, 7)
    assert batch.past[0][:, 0, :, 0].tolist() == [[1, 1, 0, 0], [2, 2, 2, 2], [3, 3, 3, 0]]
    assert batch.positions.tolist() == [2, 4, 3] and batch.last.tolist() == [5, 6, 7]
    mask = batch.step_mask()  # each row's columns and its new token's, from column 0
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    batch.advance([np.ones((3, 1, 5, 1), np.float32)], mask)
    assert batch.positions.tolist() == [3, 5, 4] and batch.past[0].shape == (3, 1, 5, 1)
    batch.remove([1])  # the longest leaves: columns past every row's length are trimmed
    assert batch.rows == [a, c] and batch.past[0].shape == (2, 1, 4, 1)
    assert batch.positions.tolist() == [3, 4]
    batch.remove([0, 1])
    assert len(batch) == 0 and batch.past == []


def run_alone(prompt, max_new=6, step=toy_step, layout="left"):
    sched = Scheduler(
        step, empty_past, [EOS], max_running=1, max_queue=4, name="generate", layout=layout
    )
    seq = make(prompt, max_new)
    sched.submit(seq)
    sched.run_until_idle()
    return seq.tokens


def test_in_flight_batching_is_invariant_to_batch_company_and_join_time():
    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 2, 1], [3, 3]]
    alone = [run_alone(p) for p in prompts]
    sched = Scheduler(toy_step, empty_past, [EOS], max_running=3, max_queue=8, name="generate")
    seqs = [make(p, 6) for p in prompts[:2]]
    for s in seqs:
        sched.submit(s)
    sched.step()
    sched.step()  # the first two are decoding; the others join mid-flight
    for p in prompts[2:]:
        seqs.append(make(p, 6))
        sched.submit(seqs[-1])
    sched.run_until_idle()
    assert [s.tokens for s in seqs] == alone
    assert max(sched.batch_sizes) == 3  # bounded by max_running
    assert all(len(t) == 6 for t in alone)


def test_right_padded_batching_is_invariant_and_rows_join_without_waiting():
    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 2, 1], [3, 3], [2, 5, 1, 1, 4]]
    alone = [run_alone(p, step=toy_right_step, layout=RIGHT) for p in prompts]
    sched = Scheduler(
        toy_right_step, empty_past, [EOS], max_running=4, max_queue=8, name="g", layout=RIGHT
    )
    seqs = [make(p, 6) for p in prompts[:2]]
    for s in seqs:
        sched.submit(s)
    sched.step()
    for p in prompts[2:]:  # rows of every length join mid-flight, at once
        seqs.append(make(p, 6))
        sched.submit(seqs[-1])
        sched.step()
        assert not sched.joining
    sched.run_until_idle()
    assert [s.tokens for s in seqs] == alone
    assert len(set(map(tuple, alone))) == len(alone)  # the toy tells the prompts apart
    assert max(sched.batch_sizes) == 4


def test_in_place_steps_with_headroom_give_the_same_tokens():
    """A batch with headroom keeps free columns (grown when full) and the step writes into
    them: the tokens are those of the copying path alone."""
    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 2, 1], [3, 3], [2, 5, 1, 1, 4]]
    alone = [run_alone(p, 9, step=toy_right_step, layout=RIGHT) for p in prompts]
    IN_PLACE_CALLS.clear()
    sched = Scheduler(
        toy_in_place_step,
        empty_past,
        [EOS],
        max_running=3,
        max_queue=8,
        name="g",
        layout=RIGHT,
        kv_headroom=3,
    )
    seqs = [make(p, 9) for p in prompts]
    for s in seqs:
        sched.submit(s)
        sched.step()
    sched.run_until_idle()
    assert [s.tokens for s in seqs] == alone
    assert len(IN_PLACE_CALLS) > 10 and len(set(IN_PLACE_CALLS)) > 1  # in place, and it grew


def test_right_kv_batch_headroom_keeps_room_for_the_next_column():
    batch = RightKVBatch(headroom=4)
    row = lambda n, v: [np.full((1, 1, n, 1), v, np.float32)]  # noqa: E731
    batch.add(make([1]), row(2, 1.0), 2, 5)
    assert batch.past[0].shape[2] == 6 and batch.width == 2  # 2 columns + 4 free
    batch.add(make([2]), row(7, 2.0), 7, 6)
    assert batch.past[0].shape[2] == 11 and batch.step_mask().shape == (2, 8)
    assert batch.past[0][0, 0, :, 0].tolist() == [1, 1] + [0] * 9
    for _ in range(4):  # in-place steps: the same buffers come back
        batch.advance(batch.past, batch.step_mask())
    assert batch.width == 11 and batch.past[0].shape[2] == 15  # full: grown by 4


def test_the_toy_right_step_notices_a_left_padded_batch():
    """The invariance test above can fail: the right-padded toy in a left-padded batch differs."""
    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 2, 1]]
    alone = [run_alone(p, step=toy_right_step, layout=RIGHT) for p in prompts]
    sched = Scheduler(toy_right_step, empty_past, [EOS], max_running=3, max_queue=8, name="g")
    seqs = [make(p, 6) for p in prompts]
    for s in seqs:
        sched.submit(s)
    sched.run_until_idle()
    assert [s.tokens for s in seqs] != alone


def test_exactly_one_final_output_per_request_and_stop_reasons():
    out: list = []
    sched = Scheduler(toy_step, empty_past, [EOS], max_running=4, max_queue=4, name="generate")
    seqs = [make([1, 2], 4, out=out), make([3], 2, out=out, stop=("xyz",))]
    for s in seqs:
        sched.submit(s)
    sched.run_until_idle()
    for s in seqs:
        finals = [r for i, _, r in out if i == s.id and r is not None]
        assert finals == [FINISH_LENGTH]
        text = "".join(t for i, t, _ in out if i == s.id)
        assert text == CharTokenizer().decode(s.tokens)
    stopper = make([1, 2], 10, out=out, stop=(CharTokenizer().decode(seqs[0].tokens[1:2]),))
    sched.submit(stopper)
    sched.run_until_idle()
    assert [r for i, _, r in out if i == stopper.id and r] == [FINISH_STOP]


def test_overload_and_cancellation_and_close():
    out: list = []
    sched = Scheduler(toy_step, empty_past, [EOS], max_running=1, max_queue=1, name="generate")
    flag = {"cancel": False}
    first = make([1], 20, out=out, cancelled=lambda: flag["cancel"])
    second = make([2], 20, out=out)
    sched.submit(first)
    sched.step()  # first runs; the queue is empty again
    sched.submit(second)
    with pytest.raises(StageUnavailableError, match="overloaded"):
        sched.submit(make([3], 2))
    flag["cancel"] = True
    sched.step()  # the cancelled one leaves within one step; the queued one takes its slot
    assert [r for i, _, r in out if i == first.id and r] == ["error"]
    assert sched.batch.rows == [second]
    sched.close()
    errors = [e for i, e, r in out if i == second.id and r == "error"]
    assert len(errors) == 1 and isinstance(errors[0], StageUnavailableError)
    with pytest.raises(StageUnavailableError, match="shutting down"):
        sched.submit(make([1]))


def test_render_prompt_uses_the_chat_template_only_when_asked():
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<a>"
    assert render_prompt("hi", template, True) == "<user>hi<a>"
    assert render_prompt("hi", template, False) == "hi"
    assert render_prompt("hi", None, True) == "hi"


def test_a_chat_template_is_compiled_once_and_renders_each_prompt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Compiling the template cost ~1.6 ms of every request (py-spy of the served stub); it is
    compiled once per template, and each prompt still renders its own text."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    compiled: list[str] = []
    original = ImmutableSandboxedEnvironment.from_string

    def counting(self: object, source: str, *args: object, **kwargs: object) -> object:
        compiled.append(source)
        return original(self, source, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ImmutableSandboxedEnvironment, "from_string", counting)
    template = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}#once"
    assert [render_prompt(t, template, True) for t in ("a", "b", "a")] == [
        "[a]#once",
        "[b]#once",
        "[a]#once",
    ]
    assert compiled == [template]


def test_prefills_are_batched_within_the_padded_token_budget() -> None:
    calls: list[tuple[int, int]] = []

    def counting(ids, mask, positions, past):
        if past[0].shape[2] == 0:
            calls.append(ids.shape)
        return toy_step(ids, mask, positions, past)

    prompts = [[1, 2], [3, 4, 5], [6] * 9, [2]]
    alone = [run_alone(p, 3) for p in prompts]
    sched = Scheduler(
        counting,
        empty_past,
        [EOS],
        max_running=8,
        max_queue=8,
        max_prefill_tokens=9,
        name="generate",
    )
    seqs = [make(p, 3) for p in prompts]
    for s in seqs:
        sched.submit(s)
    sched.run_until_idle()
    assert [s.tokens for s in seqs] == alone
    assert calls == [
        (2, 3),
        (1, 9),
        (1, 1),
    ]  # 2 x 3 fits 9 tokens; 3 x 9 does not; the long one alone


def test_a_request_pinning_another_variant_is_refused_naming_the_field() -> None:
    from tritonforge.generation import check_variant

    check_variant(None, "int8", "generate_int8")  # not pinned
    check_variant(b"int8", "int8", "generate_int8")
    with pytest.raises(
        InvalidInputError, match=r"^variant: model 'generate' serves variant 'fp32'"
    ):
        check_variant("int8", "fp32", "generate")


def clocked(now: list[float], max_queue: int, name: str = "generate") -> Scheduler:
    """One slot, ``queue_timeout_s`` 10 s, on the fake clock ``now[0]``."""
    return Scheduler(
        toy_step, empty_past, [EOS], max_running=1, max_queue=max_queue, name=name,
        queue_timeout_s=10.0, clock=lambda: now[0],
    )  # fmt: skip


def test_a_request_queued_past_queue_timeout_s_is_refused_and_the_rest_still_run() -> None:
    """Chaos finding: the engine's queue had no deadline, so a request admitted behind floods
    waited as long as they took (35 hung past 60 s). A fake clock: no timing in a unit test.
    Since issue #36 the forecast refuses early; a committed request the forecast let wait is
    refused at twice ``queue_timeout_s`` (``queue_forecast.overdue_s``), not at the timeout."""
    now = [0.0]
    out: list = []
    sched = clocked(now, max_queue=4)
    running = make([1], 20, out=out)
    sched.submit(running)
    sched.step()  # running takes the only slot
    old, young = make([2], 2, out=out), make([3], 2, out=out)
    sched.submit(old)
    now[0] = 6.0
    sched.submit(young)
    now[0] = 19.9
    sched.step()  # old waited 19.9 s: not yet
    assert list(sched.waiting) == [old, young]
    now[0] = 20.0
    sched.step()  # old waited 20 s: refused; young (14 s) waits on
    errors = [e for i, e, r in out if i == old.id and r == "error"]
    assert len(errors) == 1 and isinstance(errors[0], StageUnavailableError)
    assert "queued longer than queue_timeout_s 10 s" in str(errors[0])
    assert "retry later" in str(errors[0])
    assert list(sched.waiting) == [young] and sched.batch.rows == [running]
    running.is_cancelled = lambda: True
    sched.run_until_idle()  # young gets the freed slot before its deadline and finishes
    assert [r for i, _, r in out if i == young.id and r] == [FINISH_LENGTH]
    assert len([r for i, _, r in out if i == old.id and r]) == 1  # exactly one final


def test_queue_timeout_s_must_be_positive() -> None:
    with pytest.raises(ValueError, match="queue_timeout_s"):
        Scheduler(
            toy_step,
            empty_past,
            [EOS],
            max_running=1,
            max_queue=1,
            name="generate",
            queue_timeout_s=0,
        )


def test_every_scheduler_message_names_the_model_serving() -> None:
    """Issue #19: ``generate_int8``'s refusals said "generate: overloaded", sending operators and
    the chaos report to the wrong model. The name is the model's (its config's), never a
    literal; the shape ("<model>: overloaded ...") is what clients and docs match on."""
    now = [0.0]
    out: list = []
    sched = clocked(now, max_queue=1, name="generate_int8")
    flag = {"cancel": False}
    running = make([1], 20, out=out, cancelled=lambda: flag["cancel"])
    sched.submit(running)
    sched.step()
    queued = make([2], 2, out=out)
    sched.submit(queued)
    with pytest.raises(StageUnavailableError) as full:
        sched.submit(make([3], 2))
    now[0] = 20.0
    sched.step()  # queued waited 20 s: twice queue_timeout_s (queue_forecast.overdue_s)
    flag["cancel"] = True
    sched.step()  # running is cancelled
    last = make([4], 2, out=out)
    sched.submit(last)
    sched.close()
    errors = [str(e) for _, e, r in out if r == "error"] + [str(full.value)]
    assert len(errors) == 4, errors
    assert all(e.startswith("generate_int8: ") for e in errors), errors
    assert "generate_int8: overloaded (1 running, 1 queued, max_queue 1)" in errors[-1]
    assert any(e.startswith("generate_int8: overloaded: queued longer") for e in errors), errors
    assert sched.thread is None or sched.thread.name == "generate_int8-scheduler"


def test_the_engine_names_its_scheduler_after_the_served_config(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine passes its config's name, so each variant's model names itself."""
    import json

    from tokenizers import Tokenizer, models

    from tritonforge import generate_engine
    from tritonforge.modelconfig import ModelConfig

    Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]")).save(
        str(tmp_path / "tokenizer.json")
    )
    (tmp_path / "generation.json").write_text(json.dumps({"eos_token_ids": [EOS]}))
    monkeypatch.setattr(generate_engine, "verify_sidecar", lambda *_, **__: None)
    monkeypatch.setattr(
        generate_engine,
        "OrtDecoder",
        lambda *_: type("D", (), {"empty_past": empty_past, "layout": RIGHT, "kv_headroom": 4})(),
    )
    params = {
        "decoder_file": "decoder.onnx", "tokenizer_file": "tokenizer.json",
        "generation_file": "generation.json", "max_prompt_tokens": "8",
        "max_new_tokens_limit": "4", "default_max_new_tokens": "2", "max_running": "1",
        "max_queue": "1", "queue_timeout_s": "10",
    }  # fmt: skip
    for name in ("generate", "generate_int8"):
        config = ModelConfig.from_json({"name": name, "parameters": params})
        engine = generate_engine.GenerateEngine(config, tmp_path)
        assert engine.scheduler.name == name
        engine.scheduler.submit(make([1], 2))
        with pytest.raises(StageUnavailableError, match=f"^{name}: overloaded"):
            engine.scheduler.submit(make([1], 2))


def pad_sensitive_step(ids, mask, positions, past):
    """:func:`toy_step` whose answer also moves with each row's left padding modulo 4, as ONNX
    Runtime's reductions over the cache columns do (measured: bits change unless a row's
    padding is a multiple of 4)."""
    logits, present = toy_step(ids, mask, positions, past)
    pads = mask.argmax(1) % 4  # leading masked columns
    return np.stack([np.roll(lg, int(p), -1) for lg, p in zip(logits, pads, strict=True)]), present


def test_answers_do_not_depend_on_the_batch_even_when_the_decoder_sees_padding():
    """Issue 20: int8 greedy tokens changed with the batch (10 of 20 prompts) because a row's
    left padding (mod 4) changes the decoder's bits. Prefills are right-padded and rows join
    only when their padding is a multiple of 4, so every row decodes exactly as alone."""

    def alone(prompt):
        sched = Scheduler(
            pad_sensitive_step, empty_past, [EOS], max_running=1, max_queue=1, name="generate"
        )
        seq = make(prompt, 6)
        sched.submit(seq)
        sched.run_until_idle()
        return seq.tokens

    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 2, 1], [3, 3], [2] * 5, [7, 1, 4, 4, 4, 4, 4]]
    want = [alone(p) for p in prompts]
    sched = Scheduler(
        pad_sensitive_step, empty_past, [EOS], max_running=4, max_queue=8, name="generate"
    )
    seqs = [make(p, 6) for p in prompts[:3]]
    for s in seqs:
        sched.submit(s)
    sched.step()
    for p in prompts[3:]:  # these join mid-flight, some waiting for the width to fit
        seqs.append(make(p, 6))
        sched.submit(seqs[-1])
    sched.run_until_idle()
    assert [s.tokens for s in seqs] == want
    assert max(sched.batch_sizes) == 4
