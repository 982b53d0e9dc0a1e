"""Streaming-generation SLOs: per-request samples (time to first token, inter-token latency,
request latency, output tokens) -> a summary and the breached gates. Plain functions (no Locust
import), shared by the generation locustfile and tested directly."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tritonforge.loadtest.slo import AsDict


@dataclass(frozen=True)
class StreamSample:
    ttft_ms: float
    itl_ms: float  # mean gap between tokens after the first (nan for a 1-token answer)
    latency_ms: float
    tokens: int
    ok: bool


@dataclass(frozen=True)
class GenerationSlos:
    ttft_p95_ms: float = 2000.0
    itl_p95_ms: float = 500.0
    latency_p99_ms: float = 30_000.0
    min_tokens_per_s: float = 5.0
    max_fail_ratio: float = 0.01


@dataclass(frozen=True)
class StreamSummary(AsDict):
    requests: int
    failures: int
    window_s: float
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    itl_p50_ms: float
    itl_p95_ms: float
    latency_p50_ms: float
    latency_p99_ms: float


def _pct(values: Sequence[float], q: float) -> float:
    clean = [v for v in values if v == v]  # drop nan
    return float(np.percentile(clean, q)) if clean else float("nan")


def summarize(samples: Sequence[StreamSample], window_s: float) -> StreamSummary:
    ok = [s for s in samples if s.ok]
    return StreamSummary(
        requests=len(samples),
        failures=len(samples) - len(ok),
        window_s=window_s,
        tokens_per_s=sum(s.tokens for s in ok) / window_s if window_s > 0 else 0.0,
        ttft_p50_ms=_pct([s.ttft_ms for s in ok], 50),
        ttft_p95_ms=_pct([s.ttft_ms for s in ok], 95),
        itl_p50_ms=_pct([s.itl_ms for s in ok], 50),
        itl_p95_ms=_pct([s.itl_ms for s in ok], 95),
        latency_p50_ms=_pct([s.latency_ms for s in ok], 50),
        latency_p99_ms=_pct([s.latency_ms for s in ok], 99),
    )


def check(slos: GenerationSlos, s: StreamSummary) -> list[str]:
    """Every breached gate as ``"name measured <op> limit"``; empty when all hold. A run with no
    successful stream breaches ``min_tokens_per_s`` (nothing reached the server)."""
    if s.requests == s.failures:
        return [
            f"min_tokens_per_s 0 ({s.requests} requests, none succeeded) < {slos.min_tokens_per_s:g}"
        ]
    out = []
    fail_ratio = s.failures / s.requests
    for name, value, limit in (
        ("ttft_p95_ms", s.ttft_p95_ms, slos.ttft_p95_ms),
        ("itl_p95_ms", s.itl_p95_ms, slos.itl_p95_ms),
        ("latency_p99_ms", s.latency_p99_ms, slos.latency_p99_ms),
        ("max_fail_ratio", fail_ratio, slos.max_fail_ratio),
    ):
        if value > limit:
            out.append(f"{name} {value:.4g} > {limit:g}")
    if s.tokens_per_s < slos.min_tokens_per_s:
        out.append(f"min_tokens_per_s {s.tokens_per_s:.2f} < {slos.min_tokens_per_s:g}")
    return out
