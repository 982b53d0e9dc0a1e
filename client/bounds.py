"""Bounds of the client's policy numbers, declared on the dataclass fields and checked once.

``field(default=4, metadata=at_least(1))``; the dataclass's ``__post_init__`` calls
:func:`check_bounds`, which raises ``ValueError`` naming the field (``ClientSettings`` turns it
into an :class:`InvalidRequestError`).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

LOW, HIGH, ABOVE = "at_least", "at_most", "above"


def at_least(low: float, high: float | None = None) -> dict[str, float]:
    """``low <= value`` (and ``<= high`` when given)."""
    return {LOW: low} if high is None else {LOW: low, HIGH: high}


def above(low: float) -> dict[str, float]:
    """``low < value``."""
    return {ABOVE: low}


def check_bounds(obj: Any) -> None:
    """Every field of the dataclass ``obj`` within its declared bounds, else ``ValueError``."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        bounds = f.metadata
        if LOW in bounds and value < bounds[LOW]:
            raise ValueError(f"{f.name} must be >= {bounds[LOW]:g}, got {value}")
        if HIGH in bounds and value > bounds[HIGH]:
            raise ValueError(f"{f.name} must be <= {bounds[HIGH]:g}, got {value}")
        if ABOVE in bounds and value <= bounds[ABOVE]:
            raise ValueError(f"{f.name} must be > {bounds[ABOVE]:g}, got {value}")
