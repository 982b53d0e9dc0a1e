"""The served ``generate`` model's side: a request's structured-output parameters (v2 request
parameters, or what ``/v1`` sends as them) -> its row's processing, and the logprobs each
response carries."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from tritonforge.scheduler import Generation
from tritonforge.tasks.generation.structured.grammar import GrammarTokenizer
from tritonforge.tasks.generation.structured.logprobs import entries_json
from tritonforge.tasks.generation.structured.params import parse_structured


class StructuredRows:
    """Attaches each request's processing to its :class:`Generation` (None when it asks for
    none: today's path). The tokenizer's llguidance view is built on the first request with a
    schema (about a second for a 49k vocabulary), then shared."""

    def __init__(self, tokenizer: Any, eos_id: int, vocab_size: int) -> None:
        """``vocab_size``: the decoder's logits width."""
        self.tokenizer, self.eos_id, self.vocab_size = tokenizer, eos_id, vocab_size
        self._grammar: GrammarTokenizer | None = None
        self._lock = threading.Lock()

    def grammar(self) -> GrammarTokenizer:
        with self._lock:
            if self._grammar is None:
                self._grammar = GrammarTokenizer(self.tokenizer, self.eos_id, self.vocab_size)
            return self._grammar

    def attach(self, seq: Generation, values: Mapping[str, Any]) -> None:
        """``seq.processing`` from ``values``; :class:`StructuredInputError` (a 400 naming the
        field) on a bad one."""
        params = parse_structured(values, self.vocab_size)
        seq.processing = params.chain(self.grammar() if params.schema is not None else None)


def logprobs_since_last(seq: Generation) -> str | None:
    """The JSON of ``seq``'s token logprobs not sent yet (None: it asked for none)."""
    recorder = getattr(seq.processing, "logprobs", None)
    if recorder is None:
        return None
    return entries_json(recorder.take(len(seq.tokens)))
