"""Errors of the export stage: one base, a few leaves; each message says what failed and what to do."""

from __future__ import annotations

from collections.abc import Sequence

from tritonforge.errors import TritonforgeError


class ExportError(TritonforgeError):
    """Base class of every export failure. The model repository is left unchanged."""


class SpecError(ExportError):
    """The export spec is unknown or inconsistent."""


class VerificationError(ExportError):
    """One or more verification checks failed; ``failures`` lists every one of them."""

    title = "export verification failed"

    def __init__(self, failures: Sequence[str], context: str = "") -> None:
        self.failures = list(failures)
        head = f"{self.title}{f' ({context})' if context else ''}: {len(self.failures)} problem(s)"
        super().__init__(
            head
            + "\n"
            + "\n".join(f"  - {f}" for f in self.failures)
            + "\nThe model repository was left unchanged."
        )


class QuantAuditError(VerificationError):
    """QuantizeLinear/DequantizeLinear nodes with invalid scales, zero points or axes."""

    title = "int8 quantization audit failed"


class QualityGateError(VerificationError):
    """No int8 setting met the cosine-similarity gate; the message has the best figures."""

    title = "int8 quality gate failed"


class ConfigCheckError(VerificationError):
    """A config.pbtxt does not match its exported graph."""

    title = "config.pbtxt check failed"
