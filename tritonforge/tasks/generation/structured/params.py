"""The structured-output request parameters (OpenAI's names), checked into
:class:`StructuredParams`, and a row's :class:`RowChain` built from them (None when a request
asks for none: the scheduler's path then stays today's)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tritonforge.tasks.generation.structured.errors import StructuredInputError
from tritonforge.tasks.generation.structured.grammar import GrammarTokenizer, json_schema_of
from tritonforge.tasks.generation.structured.logprobs import MAX_TOP_LOGPROBS, LogprobRecorder
from tritonforge.tasks.generation.structured.processors import (
    LogitBias,
    Penalties,
    Processor,
    RowChain,
)

STRUCTURED_FIELDS = (
    "response_format",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "logprobs",
    "top_logprobs",
)


@dataclass(frozen=True)
class StructuredParams:
    schema: dict[str, Any] | None = None  # the JSON schema the output must follow
    logit_bias: dict[int, float] = field(default_factory=dict)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: bool = False
    top_logprobs: int = 0

    def chain(self, grammar_tokenizer: GrammarTokenizer | None) -> RowChain | None:
        """The row's processing, or None when nothing is asked (today's path)."""
        processors: list[Processor] = []
        if self.logit_bias:
            processors.append(LogitBias(self.logit_bias))
        if self.presence_penalty or self.frequency_penalty:
            processors.append(Penalties(self.presence_penalty, self.frequency_penalty))
        if self.schema is not None:
            if grammar_tokenizer is None:
                raise ValueError("a schema needs the model's GrammarTokenizer")
            processors.append(grammar_tokenizer.matcher(self.schema))
        recorder = LogprobRecorder(self.top_logprobs) if self.logprobs else None
        if not processors and recorder is None:
            return None
        return RowChain(processors, recorder)


def _json(value: Any) -> Any:
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    return json.loads(value) if isinstance(value, str) else value


def _number(values: Mapping[str, Any], name: str, low: float, high: float) -> float:
    value = values.get(name)
    if value is None:
        return 0.0
    try:
        number = float(_json(value))
    except (TypeError, ValueError) as e:
        raise StructuredInputError(name, f"must be a number, got {value!r}") from e
    if not low <= number <= high:
        raise StructuredInputError(name, f"must be in [{low:g}, {high:g}], got {number:g}")
    return number


def _logit_bias(value: Any, vocab_size: int) -> dict[int, float]:
    try:
        bias = _json(value)
    except ValueError as e:
        raise StructuredInputError("logit_bias", f"invalid JSON ({e})") from e
    if not isinstance(bias, Mapping):
        raise StructuredInputError("logit_bias", "must map token ids to numbers")
    out: dict[int, float] = {}
    for key, v in bias.items():
        try:
            token = int(key)
        except (TypeError, ValueError) as e:
            raise StructuredInputError("logit_bias", f"invalid key {key!r} (not a token id)") from e
        if not 0 <= token < vocab_size:
            raise StructuredInputError(
                f"logit_bias.{key}", f"invalid token id: out of range [0, {vocab_size})"
            )
        if isinstance(v, bool) or not isinstance(v, int | float) or not -100 <= v <= 100:
            raise StructuredInputError(f"logit_bias.{key}", f"must be in [-100, 100], got {v!r}")
        out[token] = float(v)
    return out


def _logprobs(values: Mapping[str, Any]) -> tuple[bool, int]:
    """``logprobs``: a boolean (chat) or a count in [0, 20] (completions, the top count);
    ``top_logprobs`` in [0, 20] needs ``logprobs`` true."""
    raw, top = values.get("logprobs"), values.get("top_logprobs")
    wanted, n = False, 0
    if raw is not None:
        raw = _json(raw)
        if isinstance(raw, bool):
            wanted = raw
        elif isinstance(raw, int) and 0 <= raw <= MAX_TOP_LOGPROBS:
            wanted, n = True, raw
        else:
            raise StructuredInputError(
                "logprobs", f"must be a boolean or an integer in [0, {MAX_TOP_LOGPROBS}]"
            )
    if top is not None:
        top = _json(top)
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise StructuredInputError(
                "top_logprobs", f"must be an integer in [0, {MAX_TOP_LOGPROBS}], got {top!r}"
            )
        if not wanted:
            raise StructuredInputError("top_logprobs", "invalid without logprobs: true")
        n = top
    return wanted, n


def parse_structured(values: Mapping[str, Any], vocab_size: int) -> StructuredParams:
    """:class:`StructuredParams` from a request's fields (:data:`STRUCTURED_FIELDS`; JSON
    strings accepted, as Triton request parameters carry them); the first bad field raises
    :class:`StructuredInputError` naming it."""
    logprobs, top = _logprobs(values)
    bias = values.get("logit_bias")
    return StructuredParams(
        schema=json_schema_of(values.get("response_format")),
        logit_bias=_logit_bias(bias, vocab_size) if bias is not None else {},
        presence_penalty=_number(values, "presence_penalty", -2.0, 2.0),
        frequency_penalty=_number(values, "frequency_penalty", -2.0, 2.0),
        logprobs=logprobs,
        top_logprobs=top,
    )
