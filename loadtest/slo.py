"""SLO thresholds, latency summaries and response validation: plain functions (no Locust import,
so tests can use them) shared by the locustfiles and the benchmark."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tritonforge.loadtest.errors import LoadtestError


class AsDict:
    """``as_dict()`` of a dataclass record (what the reports write)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]


@dataclass(frozen=True)
class SloThresholds:
    """A run passes when p95/p99 are at most these, rps at least ``min_rps``, failures bounded."""

    p95_ms: float = 1000.0
    p99_ms: float = 2000.0
    min_rps: float = 5.0
    max_fail_ratio: float = 0.01


def check_slos(
    t: SloThresholds,
    *,
    requests: int,
    p95_ms: float,
    p99_ms: float,
    rps: float,
    fail_ratio: float,
) -> list[str]:
    """Every breached threshold as ``"name measured <op> limit"``; empty when all hold."""
    if requests == 0:
        return [f"min_rps 0 requests completed < {t.min_rps:g} (no traffic reached the server)"]
    breaches = []
    if p95_ms > t.p95_ms:
        breaches.append(f"p95_ms {p95_ms:.1f} > {t.p95_ms:g}")
    if p99_ms > t.p99_ms:
        breaches.append(f"p99_ms {p99_ms:.1f} > {t.p99_ms:g}")
    if rps < t.min_rps:
        breaches.append(f"min_rps {rps:.2f} < {t.min_rps:g}")
    if fail_ratio > t.max_fail_ratio:
        breaches.append(f"max_fail_ratio {fail_ratio:.4f} > {t.max_fail_ratio:g}")
    return breaches


@dataclass(frozen=True)
class Summary(AsDict):
    """Exact statistics of one measured window (successful requests only for latencies)."""

    requests: int
    failures: int
    window_s: float
    rps: float
    sentences_per_s: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float


def summarize(
    samples: Sequence[tuple[float, float, bool]], begin: float, texts_per_request: int
) -> Summary:
    """Statistics of ``samples`` = (end time s, latency ms, ok) that ended after ``begin``.

    Throughput counts successful requests over [begin, last end].
    """
    kept = [s for s in samples if s[0] >= begin]
    ok = np.array([lat for _, lat, good in kept if good], dtype=np.float64)
    failures = sum(1 for _, _, good in kept if not good)
    window_s = (max(s[0] for s in kept) - begin) if kept else 0.0
    rps = len(ok) / window_s if window_s > 0 else 0.0
    if len(ok):
        p50, p95, p99 = (float(x) for x in np.percentile(ok, [50, 95, 99]))
        mean = float(ok.mean())
    else:
        p50 = p95 = p99 = mean = float("nan")
    return Summary(
        requests=len(ok),
        failures=failures,
        window_s=window_s,
        rps=rps,
        sentences_per_s=rps * texts_per_request,
        p50_ms=p50,
        p95_ms=p95,
        p99_ms=p99,
        mean_ms=mean,
    )


NORM_TOLERANCE = 1e-3
SUM_TOLERANCE = 1e-3


class ValidationError(LoadtestError):
    """The server answered 200 but the answer breaks the pipeline's contract."""


def validate(array: np.ndarray, rows: int, dim: int) -> None:
    """Raise :class:`ValidationError` unless ``array`` is [rows, dim] finite with unit-norm rows
    (``dim``: the pipeline's, discovered from its config)."""
    if array.shape != (rows, dim):
        raise ValidationError(f"shape {list(array.shape)}, expected [{rows}, {dim}]")
    if not np.isfinite(array).all():
        raise ValidationError("non-finite values in the embeddings")
    norms = np.linalg.norm(array, axis=1)
    worst = float(np.max(np.abs(norms - 1.0)))
    if worst > NORM_TOLERANCE:
        raise ValidationError(f"row norm off by {worst:.2e} from 1 (tolerance {NORM_TOLERANCE})")


def validate_classification(
    probabilities: np.ndarray, labels: Sequence[str], rows: int, known: Sequence[str]
) -> None:
    """Raise :class:`ValidationError` unless ``probabilities`` is [rows, len(known)], finite, each
    row a distribution, and ``labels`` (one per row) are ``known`` labels and each row's argmax."""
    classes = len(known)
    if probabilities.shape != (rows, classes):
        raise ValidationError(
            f"probabilities shape {list(probabilities.shape)}, expected [{rows}, {classes}]"
        )
    if not np.isfinite(probabilities).all() or (probabilities < 0).any():
        raise ValidationError("probabilities are not finite and non-negative")
    worst = float(np.max(np.abs(probabilities.sum(axis=1) - 1.0)))
    if worst > SUM_TOLERANCE:
        raise ValidationError(f"a probability row sums to 1 {worst:+.2e} (tol {SUM_TOLERANCE})")
    if len(labels) != rows:
        raise ValidationError(f"{len(labels)} labels for {rows} texts")
    for i, label in enumerate(labels):
        if label not in known:
            raise ValidationError(f"label {label!r} is not one of {list(known)}")
        best = float(probabilities[i].max())
        if probabilities[i, list(known).index(label)] < best - 1e-6:
            raise ValidationError(f"row {i}: label {label!r} is not the most probable class")
