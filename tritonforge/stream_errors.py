"""What an in-stream error's text says, for those that carry no status.

An error inside a stream (gRPC ``error_message``, an SSE ``error`` event) has no status code;
the generate model's messages name the overload or shutdown, or start with the field they
refuse. The front (its HTTP status) and the client (its exception) read them with these hints.
"""

from __future__ import annotations

from tritonforge.generation import TEXT_INPUT
from tritonforge.pipelines import VARIANT_PARAMETER
from tritonforge.sampling import SAMPLING_FIELDS

UNAVAILABLE_HINTS = ("overloaded", "shutting down", "unavailable", "not ready")
INVALID_HINTS = (
    "invalid",
    "must be",
    "max_prompt_tokens",
    "expected",
    # the model's InvalidInputError messages start with the field they name
    *(f"{field}:" for field in (TEXT_INPUT, VARIANT_PARAMETER, *SAMPLING_FIELDS)),
)


def says_unavailable(message: str) -> bool:
    lowered = message.lower()
    return any(h in lowered for h in UNAVAILABLE_HINTS)


def says_invalid(message: str) -> bool:
    lowered = message.lower()
    return any(h in lowered for h in INVALID_HINTS)
