"""One logging setup for every command: ``--log-level`` (or ``$TRITONFORGE_LOG_LEVEL``), records
to stderr. Standard library only.

Progress lines (``==> ...``) are INFO records and print as their bare text, so a command reads as
it always did; warnings and errors print as ``warning: ...`` / ``error: ...``. At ``debug`` every
record carries its time, level and logger. ``--log-level warning`` silences the progress lines
(results a command exists to print, tables and JSON, stay on stdout).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from tritonforge.env import EnvironmentValueError, env_choice

LOG_LEVEL_ENV = "TRITONFORGE_LOG_LEVEL"
LEVELS = ("debug", "info", "warning", "error")
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The project's loggers (``logging.getLogger(__name__)`` in each package) follow ``--log-level``;
# third-party ones (onnxruntime.transformers, locust...) stay at warning unless debug is asked.
PROJECT_LOGGERS = ("tritonforge",)
_configured = False


class ConsoleFormatter(logging.Formatter):
    """INFO as the bare message; other levels as ``level: message``; everything in full at debug."""

    def __init__(self, verbose: bool = False) -> None:
        super().__init__(FORMAT, datefmt="%H:%M:%S")
        self.verbose = verbose

    def format(self, record: logging.LogRecord) -> str:
        if self.verbose:
            return super().format(record)
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        if record.levelno == logging.INFO:
            return text
        return f"{record.levelname.lower()}: {text}"


def setup_logging(level: str = "info") -> None:
    """Configure logging for this process (re-running replaces the handler)."""
    global _configured
    if level.lower() not in LEVELS:
        raise ValueError(f"log level must be one of {LEVELS}, got {level!r}")
    debug = level.lower() == "debug"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(ConsoleFormatter(verbose=debug))
    logging.basicConfig(level="DEBUG" if debug else "WARNING", handlers=[handler], force=True)
    for name in PROJECT_LOGGERS:
        logging.getLogger(name).setLevel(level.upper())
    _configured = True


def level_from_env() -> str:
    """``$TRITONFORGE_LOG_LEVEL`` (lower-cased), ``info`` when unset; a bad value raises
    :class:`tritonforge.env.EnvironmentValueError` naming the variable."""
    return env_choice(LOG_LEVEL_ENV, LEVELS, "info", ignore_case=True)


def ensure_logging() -> None:
    """Set logging up from the environment unless this process already did (a module run as
    ``python -m tritonforge.X`` rather than through ``tritonforge --log-level``)."""
    if not _configured:
        setup_logging(level_from_env())


def run_main(main: Callable[[], int]) -> int:
    """Run a command's ``main`` with logging set up (:func:`ensure_logging`); a bad environment
    value prints one line and exits 2."""
    try:
        ensure_logging()
        return int(main())
    except EnvironmentValueError as e:
        # printed, not logged: it may be $TRITONFORGE_LOG_LEVEL itself that is wrong
        print(f"error: {e}", file=sys.stderr)
        return 2
