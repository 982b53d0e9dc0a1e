"""Exceptions of the embedding client.

Everything the client raises derives from :class:`ClientError`. tritonclient's
``InferenceServerException`` (and raw socket/aiohttp/gevent errors) are translated by
:func:`client.retry.translate` and chained with ``raise ... from e``. ``attempts`` says how many
times the call was tried before giving up (1 means "not retried"). :class:`ClientError` is the
client package's base under the project root :class:`tritonforge.errors.TritonforgeError`.
"""

from __future__ import annotations

from tritonforge.errors import TritonforgeError


class ClientError(TritonforgeError):
    """Base class of every error the embedding, classification and generation clients raise."""

    transient: bool = False

    def __init__(self, message: str, *, attempts: int = 1) -> None:
        super().__init__(message)
        self.attempts = attempts


class InvalidRequestError(ClientError):
    """The server rejected the request (HTTP 4xx, gRPC INVALID_ARGUMENT...): fix the call."""


class ModelNotFoundError(InvalidRequestError):
    """The model is unknown to the server or not loaded: check the model name / repository."""


class ServerUnavailableError(ClientError):
    """The server or a model is temporarily unavailable (HTTP 503, gRPC UNAVAILABLE)."""

    transient = True


class OverloadedError(ServerUnavailableError):
    """The server refused the call for overload (a full queue, a request that waited past its
    queue timeout, generation's admission bound): HTTP 503 / gRPC ``UNAVAILABLE`` saying so.

    Transient and retried like any :class:`ServerUnavailableError`; a caller that can degrade
    catches this one (e.g. asks again with ``fallback="int8"``, serves a cached answer or sheds
    the work) where a plain ``UNAVAILABLE`` may also mean a restart (docs/reliability.md).
    """


class CircuitOpenError(ServerUnavailableError):
    """The client's circuit breaker for ``server`` is open: failing fast without calling it.

    Not retried (``transient`` False): retrying is what the breaker prevents. ``retry_after_s``
    says when the breaker lets the next probe through.
    """

    transient = False

    def __init__(
        self, message: str, *, server: str, retry_after_s: float, attempts: int = 1
    ) -> None:
        super().__init__(message, attempts=attempts)
        self.server = server
        self.retry_after_s = retry_after_s


class ConnectionFailedError(ClientError):
    """No connection to the server (refused, reset, DNS): is it running at the URL?"""

    transient = True


class DeadlineExceededError(ClientError):
    """The call did not finish within ``timeout_s`` (or the retry deadline)."""


class ServerError(ClientError):
    """The server failed while handling the request (HTTP 500, gRPC INTERNAL): see its log."""


class DiscoveryError(ClientError):
    """No pipeline facts could be read (configs refused and no repository on disk): the message
    says which setting gives the client access (the admin key or the repository)."""


class ResponseError(ClientError):
    """The server answered, but the answer is not what the model contract promises."""
