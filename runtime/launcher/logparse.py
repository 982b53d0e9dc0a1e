"""tritonserver's log: a bounded, thread-safe buffer of its lines, and what can be read from them.

Triton reports a model that failed to load only in its log (four shapes, by version and control
mode); :func:`load_failures` turns them into model name -> reason for :class:`ModelLoadError`.
"""

from __future__ import annotations

import collections
import re
import sys
import threading
from collections.abc import Iterable

_FAILED_LOAD = re.compile(r"failed to load '(?P<name>[^']+)' version \d+: (?P<reason>.+?)\"?$")
_FAILED_MODEL = re.compile(r"failed to load model '(?P<name>[^']+)': (?P<reason>.+?)\"?$")
_POLL_FAILED = re.compile(r"Poll failed for model directory '(?P<name>[^']+)': (?P<reason>.+?)\"?$")
_TABLE_ROW = re.compile(r"^\|\s*(?P<name>\S+)\s*\|\s*\d+\s*\|\s*UNAVAILABLE: (?P<reason>.*?)\s*\|$")
_FAILURE_PATTERNS = (_FAILED_LOAD, _FAILED_MODEL, _POLL_FAILED, _TABLE_ROW)

PORT_HINT = (
    " (a port is taken: pass --http-port/--grpc-port/--metrics-port or set "
    "TRITONFORGE_HTTP_PORT/_GRPC_PORT/_METRICS_PORT)"
)


# On a host without a usable CUDA driver Triton logs E-level lines about CUDA: once at start-up
# ("CudaDriverHelper has not been initialized") and, from its ensemble scheduler, which creates a
# CUDA stream per ensemble, one per ensemble load. Nothing is wrong (CPU serving needs neither),
# so the log says so once instead.
_NO_CUDA = re.compile(
    r"CudaDriverHelper has not been initialized"
    r"|unable to create stream for \S+: .*(CUDA driver version is insufficient|no CUDA-capable)"
)
NO_CUDA_NOTE = (
    "tritonforge: no usable CUDA driver on this host, serving on CPU: Triton's E-level CUDA lines "
    "('CudaDriverHelper has not been initialized', 'unable to create stream for <ensemble>' on "
    "every ensemble load) are harmless here and not shown"
)


class ServerLog:
    """The last ``max_lines`` lines of a server's output; :meth:`pump` fills it from a stream.

    Triton's E-level CUDA lines on a host without a CUDA driver are replaced by
    :data:`NO_CUDA_NOTE`, once."""

    def __init__(self, max_lines: int = 4000, echo: bool = False) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=max_lines)
        self._lock = threading.Lock()
        self._no_cuda_noted = False
        self.echo = echo
        """Also copy every line to stderr as it arrives."""

    def append(self, line: str) -> None:
        if _NO_CUDA.search(line):
            with self._lock:
                if self._no_cuda_noted:
                    return
                self._no_cuda_noted = True
            line = NO_CUDA_NOTE
        with self._lock:
            self._lines.append(line)
        if self.echo:
            print(line, file=sys.stderr, flush=True)

    def pump(self, stream: Iterable[bytes]) -> None:
        """Append each line of ``stream`` (raw bytes, decoded leniently) until it ends."""
        for raw in stream:
            self.append(raw.decode("utf-8", "replace").rstrip("\n"))

    def text(self, last: int | None = None) -> str:
        """The buffered lines (only the ``last`` ones when given), newline-joined."""
        with self._lock:
            lines = list(self._lines)
        return "\n".join(lines[-last:] if last else lines)

    def clear(self) -> None:
        with self._lock:
            self._lines.clear()


def load_failures(log_text: str) -> dict[str, str]:
    """Model name -> Triton's error for each model the log says failed to load (first wins)."""
    failures: dict[str, str] = {}
    for line in log_text.splitlines():
        for pattern in _FAILURE_PATTERNS:
            m = pattern.search(line.strip())
            if m:
                failures.setdefault(m.group("name"), m.group("reason").strip())
    return failures


def port_hint(log_tail: str) -> str:
    """What to pass when the log says a port is taken; "" otherwise."""
    return PORT_HINT if "already in use" in log_tail.lower() else ""
