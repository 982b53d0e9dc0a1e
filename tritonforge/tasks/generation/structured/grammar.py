"""Grammars for constrained decoding with llguidance (chosen over xgrammar and outlines-core by
measurement, docs/structured.md): ``response_format`` -> a grammar, the tokenizer's llguidance
view built once per model, and a row's matcher as a processor that masks the logits."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from tritonforge.tasks.generation.structured.errors import StructuredInputError

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

# Compact, deterministic separators: a small model cannot wander into unbounded whitespace.
JSON_DEFAULTS: JsonCompileOptions = {"whitespace_flexible": False}
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def json_schema_of(response_format: Any) -> dict[str, Any] | None:
    """The JSON schema a ``response_format`` asks for: None for ``text`` (or no format),
    ``{"type": "object"}`` for ``json_object``, the checked schema for ``json_schema``
    (``{"name", "schema", "strict"}``). :class:`StructuredInputError` names the bad field."""
    if response_format is None:
        return None
    if isinstance(response_format, str | bytes):
        try:
            response_format = json.loads(response_format)
        except ValueError as e:
            raise StructuredInputError("response_format", f"invalid JSON ({e})") from e
    if not isinstance(response_format, Mapping):
        raise StructuredInputError("response_format", "must be an object with a 'type'")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind != "json_schema":
        raise StructuredInputError(
            "response_format.type", f"must be text, json_object or json_schema, got {kind!r}"
        )
    spec = response_format.get("json_schema")
    if not isinstance(spec, Mapping):
        raise StructuredInputError("response_format.json_schema", "must be an object")
    name = spec.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise StructuredInputError(
            "response_format.json_schema.name", "must be 1-64 of a-z, A-Z, 0-9, _ and -"
        )
    if not isinstance(spec.get("strict", False), bool):
        raise StructuredInputError("response_format.json_schema.strict", "must be a boolean")
    schema = spec.get("schema", {})
    if not isinstance(schema, Mapping):
        raise StructuredInputError("response_format.json_schema.schema", "must be an object")
    return check_schema(dict(schema), "response_format.json_schema.schema")


def check_schema(schema: dict[str, Any], field: str) -> dict[str, Any]:
    """``schema`` when it is a valid JSON schema that llguidance compiles, else
    :class:`StructuredInputError` naming ``field`` and what is wrong."""
    import jsonschema
    import llguidance

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        raise StructuredInputError(field, f"an invalid JSON schema ({e.message})") from e
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_DEFAULTS)
    except (ValueError, TypeError) as e:
        raise StructuredInputError(field, f"invalid: unsupported ({e})") from e
    ok, error = _validate(grammar)
    if not ok:
        raise StructuredInputError(field, f"invalid: unsupported ({error})")
    return schema


def _validate(grammar: str) -> tuple[bool, str]:
    import llguidance

    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    return not is_error, "; ".join(messages)


class GrammarTokenizer:
    """The tokenizer's llguidance view (about a second to build for a 49k vocab: build it once
    per model). ``eos_id`` is the token a complete grammar allows (the stop token)."""

    def __init__(self, tokenizer: Any, eos_id: int, vocab_size: int) -> None:
        """``tokenizer``: a ``tokenizers.Tokenizer``; ``vocab_size``: the logits' width."""
        import llguidance.hf
        from transformers import PreTrainedTokenizerFast

        eos = tokenizer.id_to_token(eos_id)
        hf = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=eos)
        self.ll = llguidance.hf.from_tokenizer(hf, n_vocab=vocab_size)
        self.eos_id, self.vocab_size = eos_id, vocab_size

    def matcher(self, schema: dict[str, Any]) -> GrammarProcessor:
        import llguidance

        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_DEFAULTS)
        return GrammarProcessor(llguidance.LLMatcher(self.ll, grammar), self)


class GrammarProcessor:
    """One row's grammar state: :meth:`apply` masks the tokens the grammar forbids next (a
    complete grammar allows only the stop token, so the row ends); :meth:`accept` advances.
    A matcher in error (it should not happen) allows only the stop token: the row ends rather
    than failing the batch."""

    def __init__(self, matcher: Any, tok: GrammarTokenizer) -> None:
        import llguidance.numpy as lln

        self.matcher, self.tok, self.lln = matcher, tok, lln
        self.bitmask = lln.allocate_token_bitmask(1, tok.vocab_size)

    def apply(self, logits: np.ndarray) -> None:
        """Mask ``logits`` ([vocab] float, changed in place)."""
        if self.matcher.is_error():
            stop = logits[self.tok.eos_id]
            logits[:] = -np.inf
            logits[self.tok.eos_id] = stop
            return
        self.lln.fill_next_token_bitmask(self.matcher, self.bitmask, 0)
        allowed = np.unpackbits(self.bitmask[0].view(np.uint8), bitorder="little")
        logits[allowed[: logits.shape[0]] == 0] = -np.inf

    def accept(self, token: int) -> None:
        if not self.matcher.is_error() and not self.matcher.is_stopped():
            self.matcher.consume_token(token)

    @property
    def error(self) -> str | None:
        return str(self.matcher.get_error()) if self.matcher.is_error() else None
