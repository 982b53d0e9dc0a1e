"""Shared fixtures. Integration tests start the real embedded Triton on free loopback ports."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tritonforge.runtime.server import EmbeddedServer, ServerSettings

PROJECT_ROOT = Path(__file__).resolve().parent.parent
MODEL_REPOSITORY = PROJECT_ROOT / "model_repository"
# The repository the pipeline tests serve (`make export` fills in the encoders).
PIPELINE_REPOSITORY = Path(os.environ.get("TRITONFORGE_MODEL_REPOSITORY", MODEL_REPOSITORY))

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


@pytest.fixture(scope="session")
def pipeline_server() -> Iterator[EmbeddedServer]:
    """The real model repository (tokenizer, encoders, ensembles, embed_bls) served
    once per session; fails with the lint's problems if it is not ready (run `make export`)."""
    from tritonforge.runtime.lint import lint_repository

    problems = lint_repository(PIPELINE_REPOSITORY)
    if problems:
        pytest.fail(
            f"{PIPELINE_REPOSITORY} is not servable (run `make export`):\n" + "\n".join(problems)
        )
    server = EmbeddedServer(ServerSettings.ephemeral(PIPELINE_REPOSITORY))
    server.start()
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture
def console_logging() -> Iterator[Callable[[str], None]]:
    """``setup_logging`` for one test: the root handlers and project levels it replaces come back
    afterwards (a handler left on a test's captured stderr would break later tests)."""
    from tritonforge.logs import PROJECT_LOGGERS, setup_logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {name: logging.getLogger(name).level for name in PROJECT_LOGGERS}
    yield setup_logging
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, value in levels.items():
        logging.getLogger(name).setLevel(value)
