"""Error translation: any exception a tritonclient call raises (``InferenceServerException`` by
HTTP status or gRPC code, raw socket/aiohttp/gevent errors) as a :class:`ClientError` whose message
says what to do. Pure functions, shared by every client.
"""

from __future__ import annotations

from tritonclient.utils import InferenceServerException

from tritonforge.client.errors import (
    ClientError,
    ConnectionFailedError,
    DeadlineExceededError,
    InvalidRequestError,
    ModelNotFoundError,
    OverloadedError,
    ServerError,
    ServerUnavailableError,
)

# gRPC UNAVAILABLE is also what a refused/reset connection looks like; these fragments say so.
_CONNECTION_HINTS = (
    "failed to connect",
    "connection refused",
    "connect failed",
    "connection reset",
    "socket closed",
    "dns resolution failed",
    "name resolution",
)
# What Triton answers while a model restarts (its stub crashed, the supervisor reloads it): whatever
# the status code, these are transient.
_RESTART_HINTS = (
    "no available versions",
    "is not healthy",
    "stub process",
    "tritonserver not reachable",
)
# What a model's queue (Triton) or generation's admission answers when it refuses for overload.
_OVERLOAD_HINTS = ("exceeds maximum queue size", "request timeout expired", "overloaded")
_INVALID_GRPC = {
    "INVALID_ARGUMENT",
    "FAILED_PRECONDITION",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "UNAUTHENTICATED",
}


def gevent_timeout() -> type[BaseException] | None:
    """gevent's ``Timeout`` (tritonclient's HTTP client raises it), if gevent is installed."""
    try:
        import gevent
    except ImportError:  # pragma: no cover - gevent ships with tritonclient[http]
        return None
    return gevent.Timeout


def _aiohttp_error() -> type[BaseException] | None:
    try:
        import aiohttp
    except ImportError:  # pragma: no cover - aiohttp ships with tritonclient[http]
        return None
    return aiohttp.ClientError


def _unavailable(text: str, message: str) -> ServerUnavailableError:
    if any(hint in message.lower() for hint in _OVERLOAD_HINTS):
        return OverloadedError(f"{text} (overloaded; retry later or degrade)")
    return ServerUnavailableError(f"{text} (server or model not ready; retry later)")


def from_status(status: str, message: str, context: str) -> ClientError:
    text = f"{context}: {message}"
    if any(hint in message.lower() for hint in _RESTART_HINTS):
        return ServerUnavailableError(f"{text} (the model is restarting; retry later)")
    if status.isdigit():
        code = int(status)
        if code == 404:
            return ModelNotFoundError(f"{text} (is the model name right and the model loaded?)")
        if code == 503:
            return _unavailable(text, message)
        if code in (408, 504):
            return DeadlineExceededError(text)
        if 400 <= code < 500:
            return InvalidRequestError(text)
        return ServerError(f"{text} (see the server log)")
    name = status.removeprefix("StatusCode.")
    if name == "UNAVAILABLE":
        lowered = message.lower()
        if "restricted" in lowered:
            return InvalidRequestError(
                f"{text} (endpoint restricted by the server's configuration)"
            )
        if any(hint in lowered for hint in _CONNECTION_HINTS):
            return ConnectionFailedError(f"{text} (is the server running at that address?)")
        return _unavailable(text, message)
    if name == "NOT_FOUND":
        return ModelNotFoundError(f"{text} (is the model name right and the model loaded?)")
    if name in _INVALID_GRPC:
        return InvalidRequestError(text)
    if name == "DEADLINE_EXCEEDED":
        return DeadlineExceededError(text)
    if name in ("INTERNAL", "UNKNOWN", "DATA_LOSS", "RESOURCE_EXHAUSTED"):
        return ServerError(f"{text} (see the server log)")
    return ClientError(f"{text} [{status}]")


def translate(exc: BaseException, context: str) -> ClientError:
    """Map any exception raised by a tritonclient call to a :class:`ClientError`.

    ``context`` names the call (model, URL, timeout); it prefixes the message. The caller chains
    the original with ``raise translate(e, ctx) from e``.
    """
    if isinstance(exc, ClientError):
        return exc
    if isinstance(exc, InferenceServerException):
        message = exc.message() or str(exc)
        status = exc.status()
        if status:
            return from_status(str(status), message, context)
        lowered = message.lower()
        if "timed out" in lowered or "timeout" in lowered:
            return DeadlineExceededError(f"{context}: {message}")
        if any(hint in lowered for hint in _CONNECTION_HINTS):
            return ConnectionFailedError(f"{context}: {message}")
        return ClientError(f"{context}: {message}")
    gevent = gevent_timeout()
    if isinstance(exc, TimeoutError) or (gevent and isinstance(exc, gevent)):
        return DeadlineExceededError(f"{context}: timed out ({type(exc).__name__}: {exc})")
    aiohttp_error = _aiohttp_error()
    if isinstance(exc, OSError) or (aiohttp_error and isinstance(exc, aiohttp_error)):
        return ConnectionFailedError(
            f"{context}: cannot reach the server ({type(exc).__name__}: {exc}); "
            "is it running at that address?"
        )
    return ClientError(f"{context}: unexpected {type(exc).__name__}: {exc}")
