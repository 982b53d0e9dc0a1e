"""Shared fixtures. Integration tests start the real embedded Triton on free loopback ports."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from runtime.server import EmbeddedServer, ServerSettings

PROJECT_ROOT = Path(__file__).resolve().parent.parent
MODEL_REPOSITORY = PROJECT_ROOT / "model_repository"

ServeFn = Callable[..., EmbeddedServer]


@pytest.fixture
def serve() -> Iterator[ServeFn]:
    """Factory: ``serve(repo, **settings)`` returns a ready server, stopped after the test."""
    servers: list[EmbeddedServer] = []

    def start(repo: Path, **kwargs: object) -> EmbeddedServer:
        server = EmbeddedServer(ServerSettings.ephemeral(repo, **kwargs))
        servers.append(server)
        server.start()
        server.wait_ready()
        return server

    yield start
    for server in servers:
        server.stop()
