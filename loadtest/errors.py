"""The load tools' exception base: every error the ``loadtest`` package raises derives from
:class:`LoadtestError` (under :class:`tritonforge.errors.TritonforgeError`)."""

from __future__ import annotations

from tritonforge.errors import TritonforgeError


class LoadtestError(TritonforgeError):
    """A load test, bench or reliability run cannot go on; the message says what to do."""


class StreamError(LoadtestError):
    """A streamed generation answered an error (an error event, or a status other than 200)."""
