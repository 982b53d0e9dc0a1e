"""Errors of the embedded runtime. One base, a few leaves; each message says what to do."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tritonforge.errors import TritonforgeError


class EmbeddedServerError(TritonforgeError):
    """Base class of every error of the embedded runtime (the launcher, the front, the
    supervisor); distinct from the client's ``tritonforge.client.errors.ServerError``."""


class ServerNotFoundError(EmbeddedServerError):
    """The Triton binary, Python backend or stub could not be found."""


class ServerStartError(EmbeddedServerError):
    """tritonserver exited or did not become ready in time."""


class ModelLoadError(ServerStartError):
    """One or more models failed to load; ``failures`` maps model name -> Triton's error."""

    def __init__(self, failures: Mapping[str, str], log_tail: str = "") -> None:
        self.failures = dict(failures)
        self.log_tail = log_tail
        lines = [f"  - {name}: {reason}" for name, reason in sorted(self.failures.items())]
        super().__init__(
            f"{len(self.failures)} model(s) failed to load:\n"
            + "\n".join(lines)
            + "\nFix the model's config.pbtxt or artifacts (run `make export`) and start again."
        )


class FrontError(EmbeddedServerError):
    """The front refused a request (``status`` is the HTTP status it answers) or cannot bind."""

    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.status = status


class OpenAIError(FrontError):
    """A refused ``/v1`` request: ``status`` the HTTP status, ``param`` the offending field,
    ``code`` OpenAI's machine-readable code; :meth:`body` is OpenAI's error object."""

    def __init__(
        self, message: str, status: int = 400, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message, status)
        self.param, self.code = param, code

    @property
    def type(self) -> str:
        if self.status == 401:
            return "authentication_error"
        if self.status == 403:
            return "permission_error"
        if self.status == 404:
            return "not_found_error" if self.code != "model_not_found" else "invalid_request_error"
        if self.status == 429:
            return "rate_limit_error"
        if self.status >= 500:
            return "server_error"
        return "invalid_request_error"

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": str(self),
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }
