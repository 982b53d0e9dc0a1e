"""SLO gate, latency summary, response validation and corpus (plain functions, no Locust)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tritonforge.loadtest import corpus
from tritonforge.loadtest.slo import SloThresholds, ValidationError, check_slos, summarize, validate

LIMITS = SloThresholds(p95_ms=100, p99_ms=200, min_rps=10, max_fail_ratio=0.01)


def test_all_thresholds_met_gives_no_breach() -> None:
    assert check_slos(LIMITS, requests=500, p95_ms=99, p99_ms=199, rps=10, fail_ratio=0.01) == []


def test_every_breached_threshold_is_named_with_its_numbers() -> None:
    breaches = check_slos(LIMITS, requests=50, p95_ms=150, p99_ms=250, rps=2.5, fail_ratio=0.2)
    assert [b.split()[0] for b in breaches] == ["p95_ms", "p99_ms", "min_rps", "max_fail_ratio"]
    assert "150.0 > 100" in breaches[0] and "2.50 < 10" in breaches[2]


def test_a_single_breach_is_reported_alone() -> None:
    breaches = check_slos(LIMITS, requests=50, p95_ms=50, p99_ms=250, rps=20, fail_ratio=0.0)
    assert breaches == ["p99_ms 250.0 > 200"]


def test_no_traffic_is_a_breach() -> None:
    assert check_slos(LIMITS, requests=0, p95_ms=0, p99_ms=0, rps=0, fail_ratio=0)


def test_summary_drops_warmup_and_counts_failures() -> None:
    samples = [(0.5, 1000.0, True)]  # before the window: ignored
    samples += [(1.0 + i * 0.1, float(i + 1), True) for i in range(100)]  # 1..100 ms
    samples += [(5.0, 7.0, False)]
    s = summarize(samples, begin=1.0, texts_per_request=4)
    assert s.requests == 100 and s.failures == 1
    assert s.window_s == pytest.approx(9.9)
    assert s.rps == pytest.approx(100 / 9.9)
    assert s.sentences_per_s == pytest.approx(4 * 100 / 9.9)
    assert s.p50_ms == pytest.approx(50.5)
    assert s.p99_ms == pytest.approx(99.01)


def test_summary_of_nothing_is_nan_not_an_error() -> None:
    s = summarize([], begin=0.0, texts_per_request=1)
    assert s.requests == 0 and s.rps == 0 and math.isnan(s.p50_ms)


def test_validate_accepts_unit_rows_and_rejects_broken_ones() -> None:
    rng = np.random.default_rng(0)
    good = rng.normal(size=(3, 384)).astype(np.float32)
    good /= np.linalg.norm(good, axis=1, keepdims=True)
    validate(good, 3)
    with pytest.raises(ValidationError, match="shape"):
        validate(good, 2)
    with pytest.raises(ValidationError, match="shape"):
        validate(good[:, :128], 3)
    bad = good.copy()
    bad[1, 0] = np.nan
    with pytest.raises(ValidationError, match="non-finite"):
        validate(bad, 3)
    with pytest.raises(ValidationError, match="norm"):
        validate(good * 1.01, 3)


def test_corpus_is_deterministic_with_the_documented_mix() -> None:
    texts = corpus.generate()
    assert texts == corpus.generate()
    assert texts != corpus.generate(seed=corpus.DEFAULT_SEED + 1)
    assert len(texts) == corpus.DEFAULT_SIZE
    words = np.array([len(t.split()) for t in texts])
    mix = corpus.LengthMix()
    assert words.min() >= mix.query_words[0] and words.max() <= mix.passage_words[1]
    # shares within a few points of 30% / 50% / 20%
    assert abs(np.mean(words <= mix.query_words[1]) - 0.3) < 0.05
    assert abs(np.mean(words >= mix.passage_words[0]) - 0.2) < 0.05
    assert all(t.strip() for t in texts)
