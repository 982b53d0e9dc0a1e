"""Structured generation (issue #34's engine pieces): per-row logits processing (grammar mask
from a JSON schema, ``logit_bias``, presence/frequency penalties) and token logprobs, hooked
into the scheduler through ``Generation.processing`` (None: today's path). docs/structured.md."""

from tritonforge.tasks.generation.structured.errors import StructuredInputError
from tritonforge.tasks.generation.structured.grammar import (
    GrammarProcessor,
    GrammarTokenizer,
    json_schema_of,
)
from tritonforge.tasks.generation.structured.logprobs import (
    LOGPROBS_OUTPUT,
    MAX_TOP_LOGPROBS,
    LogprobRecorder,
    TokenLogprob,
    chat_logprobs,
    completion_logprobs,
    entries_from_json,
    entries_json,
    token_logprob,
)
from tritonforge.tasks.generation.structured.params import (
    STRUCTURED_FIELDS,
    StructuredParams,
    parse_structured,
)
from tritonforge.tasks.generation.structured.processors import LogitBias, Penalties, RowChain

__all__ = [
    "LOGPROBS_OUTPUT",
    "MAX_TOP_LOGPROBS",
    "STRUCTURED_FIELDS",
    "GrammarProcessor",
    "GrammarTokenizer",
    "LogitBias",
    "LogprobRecorder",
    "Penalties",
    "RowChain",
    "StructuredInputError",
    "StructuredParams",
    "TokenLogprob",
    "chat_logprobs",
    "completion_logprobs",
    "entries_from_json",
    "entries_json",
    "json_schema_of",
    "parse_structured",
    "token_logprob",
]
