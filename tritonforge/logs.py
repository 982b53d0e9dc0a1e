"""One logging setup for every command: ``--log-level`` (or ``$TRITONFORGE_LOG_LEVEL``), records
to stderr as ``time level logger: message``. Standard library only."""

from __future__ import annotations

import logging
import sys

LOG_LEVEL_ENV = "TRITONFORGE_LOG_LEVEL"
LEVELS = ("debug", "info", "warning", "error")
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The project's loggers (``logging.getLogger(__name__)`` in each package) follow ``--log-level``;
# third-party ones (onnxruntime.transformers, locust...) stay at warning unless debug is asked.
PROJECT_LOGGERS = ("tritonforge", "runtime", "export", "client", "loadtest", "deploy")


def setup_logging(level: str = "info") -> None:
    """Configure logging once per process (re-running replaces the handler)."""
    if level.lower() not in LEVELS:
        raise ValueError(f"log level must be one of {LEVELS}, got {level!r}")
    root_level = "DEBUG" if level.lower() == "debug" else "WARNING"
    logging.basicConfig(
        level=root_level, format=FORMAT, datefmt="%H:%M:%S", stream=sys.stderr, force=True
    )
    for name in PROJECT_LOGGERS:
        logging.getLogger(name).setLevel(level.upper())
