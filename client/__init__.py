"""Typed embedding client for tritonforge's Triton pipelines (HTTP or gRPC, sync or asyncio).

from tritonforge.client import EmbeddingClient
with EmbeddingClient("localhost:8000") as c:
    vectors = c.embed(["hello", "world"])          # np.ndarray [2, 384], unit-norm rows
"""

from tritonforge.client.aio import AsyncEmbeddingClient
from tritonforge.client.errors import (
    ClientError,
    ConnectionFailedError,
    DeadlineExceededError,
    InvalidRequestError,
    ModelNotFoundError,
    ResponseError,
    ServerError,
    ServerUnavailableError,
)
from tritonforge.client.retry import RetryPolicy, translate
from tritonforge.client.settings import ClientSettings, route
from tritonforge.client.sync import EmbeddingClient

__all__ = [
    "AsyncEmbeddingClient",
    "ClientError",
    "ClientSettings",
    "ConnectionFailedError",
    "DeadlineExceededError",
    "EmbeddingClient",
    "InvalidRequestError",
    "ModelNotFoundError",
    "ResponseError",
    "RetryPolicy",
    "ServerError",
    "ServerUnavailableError",
    "route",
    "translate",
]
