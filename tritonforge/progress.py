"""Progress bars with an ETA for the long commands (export steps, bench cells, soak window).

A :class:`Bar` draws a tqdm bar on stderr only when stderr is a terminal; while it is open the
console log records print above it (``tqdm.contrib.logging``), so progress lines and the bar do
not overwrite each other. Anywhere else (CI, a pipe, a log file) it draws nothing and the log
lines are the record. Callers log their lines with :mod:`logging`; the bar only counts.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from tritonforge.closing import Closing

ETA_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} {unit}, {elapsed} elapsed, ~{remaining} left"


class Bar(Closing):
    """``update(n)`` / ``update_to(n)`` move the bar; ``close()`` (or ``with``) ends it."""

    def __init__(
        self,
        desc: str,
        total: float | None,
        unit: str = "it",
        bar_format: str | None = None,
        enabled: bool | None = None,
        leave: bool = True,
    ) -> None:
        # imported here: the Triton image carries this package's top-level modules without tqdm
        from tqdm import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        on = sys.stderr.isatty() if enabled is None else enabled
        self.bar: Any = tqdm(
            total=total,
            desc=desc,
            unit=unit,
            bar_format=bar_format or (ETA_FORMAT if total else None),
            disable=not on,
            file=sys.stderr,
            leave=leave,
            dynamic_ncols=True,
        )
        self._redirect = contextlib.ExitStack()
        if on:
            self._redirect.enter_context(logging_redirect_tqdm())

    @property
    def enabled(self) -> bool:
        return not self.bar.disable

    @property
    def n(self) -> float:
        return float(self.bar.n)

    def update(self, n: float = 1) -> None:
        self.bar.update(n)

    def update_to(self, n: float) -> None:
        """Move to ``n`` (capped at the total; never backwards)."""
        if self.bar.total is not None:
            n = min(n, self.bar.total)
        if n > self.bar.n:
            self.bar.update(n - self.bar.n)

    def close(self) -> None:
        self._redirect.close()
        self.bar.close()
