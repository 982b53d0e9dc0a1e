"""Typed client for tritonforge's Triton pipelines (HTTP or gRPC, sync or asyncio).

from tritonforge.client import EmbeddingClient
with EmbeddingClient("localhost:8000") as c:
    vectors = c.embed(["hello", "world"])          # np.ndarray [2, dim], unit-norm rows
    [best] = c.classify("great service", top_k=2)  # Classification(label, score, ...)
    c.pipelines()                                  # what the server serves (discovered)
    c.embed(["hi"], route="bls")                   # through the BLS (``pipeline=``: old name)

``EmbeddingClient`` (blocking) and ``AsyncEmbeddingClient`` are thin shells over one core,
:class:`client.core.BaseClient`; the generation clients are in :mod:`client.generate`. Every error
is a :class:`ClientError` (under :class:`tritonforge.errors.TritonforgeError`). A task's result
types (``Classification``, ``Ranked``, ...) are its client module's ``EXPORTS``, read from here
too (:func:`__getattr__`).
"""

from typing import Any

from tritonforge import tasks
from tritonforge.client.aio import AsyncEmbeddingClient
from tritonforge.client.core import BaseClient
from tritonforge.client.discovery import route
from tritonforge.client.errors import (
    CircuitOpenError,
    ClientError,
    ConnectionFailedError,
    DeadlineExceededError,
    DiscoveryError,
    InvalidRequestError,
    ModelNotFoundError,
    OverloadedError,
    ResponseError,
    ServerError,
    ServerUnavailableError,
)
from tritonforge.client.retry import RetryPolicy
from tritonforge.client.settings import ClientSettings
from tritonforge.client.status import translate
from tritonforge.client.sync import EmbeddingClient

__all__ = [
    "AsyncEmbeddingClient",
    "BaseClient",
    "CircuitOpenError",
    "ClientError",
    "ClientSettings",
    "ConnectionFailedError",
    "DeadlineExceededError",
    "DiscoveryError",
    "EmbeddingClient",
    "InvalidRequestError",
    "ModelNotFoundError",
    "OverloadedError",
    "ResponseError",
    "RetryPolicy",
    "ServerError",
    "ServerUnavailableError",
    "route",
    "translate",
]


def __getattr__(name: str) -> Any:
    """A registered task's client export (its ``client`` module's ``EXPORTS``)."""
    for task in tasks.registry().values():
        if (task.folder / "client.py").is_file():
            module = task.module("client")
            if name in getattr(module, "EXPORTS", ()):
                return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
