"""Exceptions shared by the models and backends.

Every error raised while serving derives from :class:`ServingError`; its ``code`` names the Triton
error code the model returns (``INVALID_ARG`` for caller mistakes, ``UNAVAILABLE`` when a stage is
not ready, ``INTERNAL`` otherwise).
"""

from __future__ import annotations


class ServingError(Exception):
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
