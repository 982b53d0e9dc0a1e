"""Classification postprocessing as pure functions: logits -> probabilities, label, top-k.

The ``<pipeline>_postprocess`` model and the classification BLS are thin loops around these;
unit tests call them directly. Only numpy is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tritonforge.errors import InvalidInputError, ModelConfigError, NumericalError, shown

OUTPUTS = ("label", "score", "probabilities", "top_labels", "top_scores")
"""What :func:`classify` returns (the public outputs of a classification pipeline)."""
TOP_K_PARAMETER = "top_k"


def read_labels(path: Path) -> tuple[str, ...]:
    """One label per line, index order (Triton's ``label_filename`` format)."""
    try:
        labels = tuple(line.strip() for line in Path(path).read_text("utf-8").splitlines())
    except OSError as e:
        raise ModelConfigError(f"label file {path} cannot be read: {e}") from e
    labels = tuple(label for label in labels if label)
    if len(labels) < 2 or len(set(labels)) != len(labels):
        raise ModelConfigError(f"{path}: needs two or more distinct labels, one per line")
    return labels


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64, returned as float32 (rows sum to 1)."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return np.asarray(e / e.sum(axis=-1, keepdims=True), dtype=np.float32)


def check_top_k(value: object, labels: int, field: str = TOP_K_PARAMETER) -> int:
    """A requested top-k as an int in ``[1, labels]``; :class:`InvalidInputError` otherwise
    (echoing at most 64 bytes of the value)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidInputError(
            f"{field!r} must be an integer from 1 to {labels}, got {shown(value)}"
        )
    if isinstance(value, str) and not (value.strip().isascii() and value.strip().isdigit()):
        raise InvalidInputError(f"{field!r} must be an integer, got {shown(value)}")
    if isinstance(value, str) and len(value.strip().lstrip("0")) > 9:
        raise InvalidInputError(f"{field!r} is out of range: use 1 to {labels}")
    k = int(value)
    if not 1 <= k <= labels:
        raise InvalidInputError(f"{field!r}={shown(k)} is out of range: use 1 to {labels}")
    return k


def classify(logits: np.ndarray, labels: Sequence[str], top_k: int) -> dict[str, np.ndarray]:
    """``[batch, classes]`` logits -> the pipeline's outputs, one row per input row.

    ``label``/``score``: the most probable class and its probability (``[batch, 1]``);
    ``probabilities``: every class (``[batch, classes]``); ``top_labels``/``top_scores``: the
    ``top_k`` best, most probable first (ties: lower index first).
    """
    x = np.asarray(logits, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != len(labels):
        raise ModelConfigError(
            f"logits have shape {list(x.shape)}; expected [batch, {len(labels)}] (one per label)"
        )
    bad = ~np.isfinite(x).all(axis=1)
    if bad.any():
        raise NumericalError(
            f"logits row {int(np.argmax(bad))} is not finite (NaN/Inf from the encoder); "
            "check the exported model"
        )
    probs = softmax(x)
    order = np.argsort(-probs, axis=1, kind="stable")[:, :top_k]
    names = np.array([s.encode("utf-8") for s in labels], dtype=object)
    top = np.take_along_axis(probs, order, axis=1)
    return {
        "label": names[order[:, :1]],
        "score": top[:, :1].astype(np.float32),
        "probabilities": probs,
        "top_labels": names[order],
        "top_scores": top.astype(np.float32),
    }
