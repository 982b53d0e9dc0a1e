"""Streaming-generation SLO gates: summaries of exact samples and every breach named."""

from __future__ import annotations

import math

from tritonforge.loadtest.slo_generate import GenerationSlos, StreamSample, check, summarize


def test_summary_and_breaches_are_named() -> None:
    samples = [StreamSample(100.0 + i, 20.0, 400.0, 16, True) for i in range(99)]
    samples.append(StreamSample(0.0, math.nan, 5.0, 0, False))
    s = summarize(samples, window_s=10.0)
    assert (s.requests, s.failures) == (100, 1)
    assert s.tokens_per_s == 99 * 16 / 10.0
    assert 149 <= s.ttft_p50_ms <= 150 and s.itl_p50_ms == 20.0
    assert check(GenerationSlos(max_fail_ratio=0.05), s) == []
    breaches = check(
        GenerationSlos(ttft_p95_ms=50, itl_p95_ms=10, min_tokens_per_s=1000, max_fail_ratio=0),
        s,
    )
    assert [b.split()[0] for b in breaches] == [
        "ttft_p95_ms",
        "itl_p95_ms",
        "max_fail_ratio",
        "min_tokens_per_s",
    ]


def test_no_successful_stream_is_a_breach() -> None:
    s = summarize([StreamSample(0, math.nan, 1, 0, False)], window_s=1.0)
    assert check(GenerationSlos(), s)[0].startswith("min_tokens_per_s 0")
    assert check(GenerationSlos(), summarize([], 1.0))[0].startswith("min_tokens_per_s 0")
