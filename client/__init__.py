"""Typed client for tritonforge's Triton pipelines (HTTP or gRPC, sync or asyncio).

from tritonforge.client import EmbeddingClient
with EmbeddingClient("localhost:8000") as c:
    vectors = c.embed(["hello", "world"])          # np.ndarray [2, dim], unit-norm rows
    [best] = c.classify("great service", top_k=2)  # Classification(label, score, ...)
    c.pipelines()                                  # what the server serves (discovered)
"""

from tritonforge.client.aio import AsyncEmbeddingClient
from tritonforge.client.classification import Classification, Ranked
from tritonforge.client.discovery import DiscoveryError, route
from tritonforge.client.errors import (
    ClientError,
    ConnectionFailedError,
    DeadlineExceededError,
    InvalidRequestError,
    ModelNotFoundError,
    OverloadedError,
    ResponseError,
    ServerError,
    ServerUnavailableError,
)
from tritonforge.client.retry import RetryPolicy, translate
from tritonforge.client.settings import ClientSettings
from tritonforge.client.sync import EmbeddingClient

__all__ = [
    "AsyncEmbeddingClient",
    "Classification",
    "ClientError",
    "ClientSettings",
    "ConnectionFailedError",
    "DeadlineExceededError",
    "DiscoveryError",
    "EmbeddingClient",
    "InvalidRequestError",
    "ModelNotFoundError",
    "OverloadedError",
    "Ranked",
    "ResponseError",
    "RetryPolicy",
    "ServerError",
    "ServerUnavailableError",
    "route",
    "translate",
]
