"""Generation's sampling: per-request settings read from a request (:func:`parse_sampling`) and
the next token drawn from one row of logits (:func:`sample_next`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tritonforge.errors import InvalidInputError

# The request fields read here (names of the Triton generate convention: vLLM / TensorRT-LLM
# backends, genai-perf); ``max_new_tokens`` is accepted as an alias of ``max_tokens``.
SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "chat_template")


@dataclass(frozen=True)
class GenerationLimits:
    max_prompt_tokens: int
    max_new_tokens_limit: int
    default_max_new_tokens: int


@dataclass(frozen=True)
class SamplingParams:
    """Per-request generation settings. ``temperature == 0`` is greedy decoding."""

    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k filter
    seed: int | None = None
    stop: tuple[str, ...] = ()
    chat_template: bool = True


def _scalar(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        if value.size != 1:
            raise ValueError(f"expected one value, got shape {list(value.shape)}")
        value = value.reshape(-1)[0]
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    if isinstance(value, np.generic):
        value = value.item()
    return value


def _stops(value: Any) -> tuple[str, ...]:
    if isinstance(value, np.ndarray):
        items = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in value.reshape(-1)]
    elif isinstance(value, str):
        items = json.loads(value) if value.startswith("[") else [value]
    elif isinstance(value, list | tuple):
        items = [str(v) for v in value]
    else:
        raise ValueError("a string or a list of strings")
    if any(not s for s in items):
        raise ValueError("stop strings must not be empty")
    return tuple(items)


def _bool(value: Any) -> bool:
    if isinstance(value, str):
        if value.lower() not in ("true", "false", "1", "0"):
            raise ValueError("true or false")
        return value.lower() in ("true", "1")
    return bool(value)


def parse_sampling(values: Mapping[str, Any], limits: GenerationLimits) -> SamplingParams:
    """Sampling parameters from request tensors/parameters (names in :data:`SAMPLING_FIELDS`;
    ``max_new_tokens`` is accepted as an alias of ``max_tokens``). Every problem is collected and
    raised as one :class:`InvalidInputError` naming each field."""
    problems: list[str] = []
    out: dict[str, Any] = {"max_new_tokens": limits.default_max_new_tokens}

    def take(
        name: str, convert: Callable[[Any], Any], check: Callable[[Any], bool], rule: str
    ) -> Any:
        if name not in values or values[name] is None:
            return None
        try:
            raw = values[name] if name == "stop" else _scalar(values[name])
            value = convert(raw)
        except (ValueError, TypeError) as e:
            problems.append(f"{name}: {e}")
            return None
        if not check(value):
            problems.append(f"{name} must be {rule}, got {value!r}")
            return None
        return value

    limit = limits.max_new_tokens_limit
    for key in ("max_tokens", "max_new_tokens"):
        n = take(key, int, lambda v: 1 <= v <= limit, f"in [1, {limit}]")
        if n is not None:
            out["max_new_tokens"] = n
    specs: dict[str, tuple[Callable[[Any], Any], Callable[[Any], bool], str]] = {
        "temperature": (float, lambda v: 0.0 <= v <= 10.0, "in [0, 10]"),
        "top_p": (float, lambda v: 0.0 < v <= 1.0, "in (0, 1]"),
        "top_k": (int, lambda v: v >= 0, ">= 0"),
        "seed": (int, lambda v: 0 <= v < 2**64, "in [0, 2**64)"),
        "stop": (_stops, lambda v: len(v) <= 8 and all(len(s) <= 64 for s in v), "<= 8 x 64"),
        "chat_template": (_bool, lambda v: True, "a boolean"),
    }
    for name, (convert, check, rule) in specs.items():
        value = take(name, convert, check, rule)
        if value is not None:
            out[name] = value
    if problems:
        raise InvalidInputError("invalid sampling parameters: " + "; ".join(problems))
    return SamplingParams(**out)


def sample_next(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """The next token id from one row of logits: argmax when greedy, else temperature, top-k and
    nucleus (top-p) filtering, sampled with ``rng`` (a fixed seed reproduces the draw)."""
    if params.temperature == 0.0:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / params.temperature
    order = np.argsort(-scaled, kind="stable")
    if params.top_k > 0:
        order = order[: params.top_k]
    kept = scaled[order]
    probs = np.exp(kept - kept.max())
    probs /= probs.sum()
    if params.top_p < 1.0:
        cut = int(np.searchsorted(np.cumsum(probs), params.top_p)) + 1
        order, probs = order[:cut], probs[:cut] / probs[:cut].sum()
    return int(order[rng.choice(len(order), p=probs)])
