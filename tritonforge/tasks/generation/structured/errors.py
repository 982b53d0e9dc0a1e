"""The structured-output request errors (a 400 naming the field)."""

from __future__ import annotations

from tritonforge.errors import InvalidInputError


class StructuredInputError(InvalidInputError):
    """A structured-output parameter is invalid; ``field`` is its name (dotted inside objects)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
