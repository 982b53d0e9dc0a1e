"""Rerank postprocess as pure functions: logits -> sigmoid scores -> stable ranking -> top_n.

The cross-encoder answers one logit per (query, document) pair (``[n, 1]``); its relevance
score is ``sigmoid(logit)`` (what sentence-transformers' ``CrossEncoder`` and Cohere/Jina report,
in [0, 1]). Ties keep the documents' request order (a stable sort), so a ranking never depends on
the sort's implementation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tritonforge.errors import NumericalError
from tritonforge.tasks.rerank.protocol import Ranked


def pair_logits(logits: np.ndarray) -> np.ndarray:
    """``[n, 1]`` (or ``[n]``) logits as float32 ``[n]``; NumericalError if any is not finite."""
    raw = np.asarray(logits, dtype=np.float32)
    if raw.ndim == 2 and raw.shape[1] == 1:
        raw = raw[:, 0]
    if raw.ndim != 1:
        raise ValueError(f"expected logits [n, 1] or [n], got shape {list(np.shape(logits))}")
    if not np.all(np.isfinite(raw)):
        bad = np.flatnonzero(~np.isfinite(raw)).tolist()
        raise NumericalError(f"the reranker produced non-finite logits for documents {bad}")
    return raw


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-x))`` in float32 without overflow for large ``|x|``."""
    x = np.asarray(logits, dtype=np.float32)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(np.float32)


def ranking(scores: np.ndarray, top_n: int | None = None) -> np.ndarray:
    """Document indices by descending score (ties: request order), cut to ``top_n``; int64."""
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    if top_n is not None:
        if top_n < 1:
            raise ValueError(f"top_n must be >= 1, got {top_n}")
        order = order[:top_n]
    return order.astype(np.int64)


def postprocess(logits: np.ndarray, top_n: int | None = None) -> dict[str, np.ndarray]:
    """The postprocess stage's outputs from ``[n, 1]`` logits: ``logits`` and ``scores``
    (float32 ``[n]``, request order) and ``ranking`` (int64 ``[min(n, top_n)]``)."""
    raw = pair_logits(logits)
    scores = sigmoid(raw)
    return {"logits": raw, "scores": scores, "ranking": ranking(scores, top_n)}


def ranked(
    scores: Sequence[float] | np.ndarray,
    logits: Sequence[float] | np.ndarray,
    order: Sequence[int] | np.ndarray,
) -> list[Ranked]:
    """The results in ``order`` (from :func:`ranking`), ready for ``protocol.render_response``."""
    return [Ranked(int(i), float(scores[int(i)]), float(logits[int(i)])) for i in order]
