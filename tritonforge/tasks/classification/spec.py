"""The classification task's spec section (``PipelineSpec.head``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Classification:
    """The classification head's serving side: labels (index order) and the default top-k."""

    labels: tuple[str, ...]
    top_k: int = 3
    instance_count: int = 1
