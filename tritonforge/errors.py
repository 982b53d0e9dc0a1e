"""The project's exception root and the errors shared by the models and backends.

Every exception the project raises derives from :class:`TritonforgeError`, through one base per
package (``ServingError`` here for the models and backends, ``ExportError``, ``EmbeddedServerError``,
``ClientError``, ...); ``except TritonforgeError`` catches all of them. No project exception
derives from a bare builtin. Every error raised while serving derives from :class:`ServingError`; its ``code`` names the Triton
error code the model returns (``INVALID_ARG`` for caller mistakes, ``UNAVAILABLE`` when a stage is
not ready, ``INTERNAL`` otherwise).
"""

from __future__ import annotations

ECHO_BYTES = 40
"""At most this many bytes of a caller's value appear in an error message (the promise is at
most 64; a 10 KB value echoed back overflowed gRPC's metadata limit: RESOURCE_EXHAUSTED)."""


def shown(value: object, limit_bytes: int = ECHO_BYTES) -> str:
    """``repr`` of ``value`` (a string as is) cut to ``limit_bytes`` bytes of UTF-8, saying how
    long it was when cut."""
    try:
        text = value if isinstance(value, str) else repr(value)
    except ValueError:  # an int past Python's 4300-digit conversion limit
        return f"<{type(value).__name__} too large to show>"
    raw = text.encode("utf-8", "replace")
    if len(raw) <= limit_bytes:
        return repr(text) if isinstance(value, str) else text
    cut = raw[:limit_bytes].decode("utf-8", "ignore")
    return f"{cut!r}... ({len(raw)} bytes)"


class TritonforgeError(Exception):
    """Root of every exception tritonforge raises; its message says what to do."""


class ServingError(TritonforgeError):
    """Base class of errors produced while loading or executing a model."""

    code: str = "INTERNAL"


class InvalidInputError(ServingError):
    """The request is malformed; the message names the offending input/field."""

    code = "INVALID_ARG"


class StageUnavailableError(ServingError):
    """A downstream stage is not ready or timed out."""

    code = "UNAVAILABLE"


class ModelConfigError(ServingError):
    """The model config (config.pbtxt / parameters) is inconsistent; the model must not load."""


class ArtifactIntegrityError(ServingError):
    """A model artifact does not match its ``.sha256`` sidecar."""


class NumericalError(ServingError):
    """A stage produced NaN/Inf where finite numbers are required."""
