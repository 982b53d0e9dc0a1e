"""Typed reads of ``TRITONFORGE_*`` environment variables: a bad value is one clear error that
names the variable (not a bare ``ValueError`` traceback). Standard library only (and the
project's exception root)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from tritonforge.errors import TritonforgeError


class EnvironmentValueError(TritonforgeError):
    """An environment variable is set to a value that cannot be used; the message names it."""


def env_str(name: str, default: str | None = None) -> str | None:
    """The variable's value, ``default`` when unset or empty."""
    value = os.environ.get(name)
    return value if value else default


def _parse(
    name: str, kind: Callable[[str], float], what: str, minimum: float | None
) -> float | None:
    raw = env_str(name)
    if raw is None:
        return None
    try:
        value = kind(raw.strip())
    except ValueError:
        raise EnvironmentValueError(f"${name} must be {what}, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise EnvironmentValueError(f"${name} must be >= {minimum:g}, got {raw!r}")
    return value


def env_int(name: str, default: int, minimum: int | None = None) -> int:
    """``int($name)``, ``default`` when unset; :class:`EnvironmentValueError` otherwise."""
    value = _parse(name, int, "an integer", minimum)
    return default if value is None else int(value)


def env_float(name: str, default: float, minimum: float | None = None) -> float:
    """``float($name)``, ``default`` when unset; :class:`EnvironmentValueError` otherwise."""
    value = _parse(name, float, "a number", minimum)
    return default if value is None else float(value)


def env_choice(name: str, choices: Sequence[str], default: str, ignore_case: bool = False) -> str:
    """``$name`` when it is one of ``choices`` (lower-cased with ``ignore_case``), ``default``
    when unset; :class:`EnvironmentValueError` otherwise."""
    raw = env_str(name)
    if raw is None:
        return default
    value = raw.strip().lower() if ignore_case else raw.strip()
    if value not in choices:
        raise EnvironmentValueError(f"${name} must be one of {', '.join(choices)}, got {raw!r}")
    return value
