"""The stream interval: several tokens per streamed response under load, every token still
delivered in order, the same text, tokens, finish reasons and logprobs alignment."""

from __future__ import annotations

import pytest

from tests.unit.test_generation import EOS, CharTokenizer, empty_past, make, toy_right_step
from tritonforge.scheduler import FINISH_LENGTH, FINISH_STOP, Scheduler
from tritonforge.text_stream import PendingText, StreamInterval


@pytest.mark.parametrize(
    ("rows_per_token", "max_tokens", "running", "expected"),
    [
        (0, 8, 16, 1),  # off: one token per response
        (4, 4, 1, 1),
        (4, 4, 4, 1),
        (4, 4, 5, 2),
        (4, 4, 8, 2),
        (4, 4, 9, 3),
        (4, 4, 16, 4),
        (4, 4, 64, 4),  # capped
        (2, 3, 0, 1),  # never below one
    ],
)
def test_tokens_per_response_grows_with_running_rows_within_its_cap(
    rows_per_token: int, max_tokens: int, running: int, expected: int
) -> None:
    assert StreamInterval(rows_per_token, max_tokens).tokens(running) == expected


def test_a_bad_stream_interval_names_the_config_parameters() -> None:
    with pytest.raises(ValueError, match="stream_interval_rows"):
        StreamInterval(-1, 4)
    with pytest.raises(ValueError, match="stream_interval_max_tokens"):
        StreamInterval(4, 0)


def test_pending_text_sends_the_first_token_at_once_then_every_n_tokens() -> None:
    pending = PendingText()
    assert pending.add("", 3) is None  # a partial character: nothing to send yet
    assert pending.add("a", 3) == "a"  # the first text goes at once (TTFT)
    assert [pending.add(c, 3) for c in "bcdefg"] == [None, None, "bcd", None, None, "efg"]
    assert pending.add("", 3) is None
    assert pending.add("h", 2) == "h"  # the token without text counted: 2 tokens pending
    assert pending.add("i", 3) is None
    assert pending.take() == "i"  # the final response takes the rest
    assert pending.take() == ""


PROMPTS = [[1, 2, 3], [4], [5, 6, 7, 8, 2, 1], [3, 3], [2, 5, 1, 1, 4], [7], [6, 6, 6], [9, 8]]


def _serve(interval: StreamInterval | None, stops: tuple[str, ...] = ()) -> list[list]:
    """Every prompt's responses ``(text, finish_reason)`` with all rows running together."""
    out: list = []
    sched = Scheduler(
        toy_right_step,
        empty_past,
        [EOS],
        max_running=len(PROMPTS),
        max_queue=len(PROMPTS),
        name="generate",
        layout="right",
        stream_interval=interval,
    )
    seqs = [make(p, 13, out=out, stop=stops) for p in PROMPTS]
    for s in seqs:
        sched.submit(s)
    sched.run_until_idle()
    return [[(t, r) for i, t, r in out if i == s.id] for s in seqs]


@pytest.mark.parametrize("stops", [(), ("ee",)])
def test_several_tokens_per_response_give_the_same_text_and_finish_with_fewer_responses(
    stops: tuple[str, ...],
) -> None:
    one = _serve(None, stops)
    several = _serve(StreamInterval(rows_per_token=2, max_tokens=4), stops)  # 8 rows: 4 tokens
    for a, b in zip(one, several, strict=True):
        assert "".join(t for t, _ in b) == "".join(t for t, _ in a)
        assert [r for _, r in b] == [None] * (len(b) - 1) + [a[-1][1]]  # one final, same reason
        assert b[0] == a[0]  # the first token alone, at once
        assert len(b) < len(a)
    # the toy decodes every token to one character: without stops (no held-back text, every
    # row running to the end) every middle response carries 4
    assert stops or all(len(t) == 4 for resp in several for t, r in resp[1:-1])
    assert {a[-1][1] for a in one} <= {FINISH_LENGTH, FINISH_STOP}


def test_logprobs_stay_aligned_with_the_text_of_each_response() -> None:
    """The stub sends with each response the logprobs of the tokens since the last one
    (``logprobs_since_last`` takes up to ``len(seq.tokens)`` at send time): the text sent so
    far must cover exactly those tokens (the toy decodes one character per token)."""
    sent: dict[int, list[tuple[str, int]]] = {}
    sched = Scheduler(
        toy_right_step,
        empty_past,
        [EOS],
        max_running=8,
        max_queue=8,
        name="generate",
        layout="right",
        stream_interval=StreamInterval(rows_per_token=2, max_tokens=4),
    )
    seqs = [make(p, 11) for p in PROMPTS]
    for s in seqs:
        s.on_output = lambda seq, text, _: sent.setdefault(seq.id, []).append(
            (text, len(seq.tokens))
        )
        sched.submit(s)
    sched.run_until_idle()
    for s in seqs:
        texts = [t for t, _ in sent[s.id]]
        assert "".join(texts) == CharTokenizer().decode(s.tokens)
        assert len(texts) < len(s.tokens)  # several tokens per response
        chars = 0
        for text, tokens in sent[s.id]:
            chars += len(text)
            assert chars == tokens


def test_the_bench_counts_every_token_of_a_chunk_in_decode_rate_and_inter_token_latency() -> None:
    from tritonforge.loadtest.bench.generate_cells import chunk_tokens, token_gaps_ms

    count = lambda text: len(text.split())  # noqa: E731 - a word per token
    assert chunk_tokens(["a", " b c d", " e", ""], count) == [1, 3, 1, 0]
    # 3 tokens 90 ms after the first: 3 latencies of 30 ms; then 1 token 10 ms later
    assert token_gaps_ms([0.0, 0.09, 0.1], [1, 3, 1]) == pytest.approx([30.0, 30.0, 30.0, 10.0])
    assert token_gaps_ms([0.0, 0.02], [1, 0]) == pytest.approx([20.0])  # no whole token: one
