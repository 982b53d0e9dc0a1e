"""A progress bar with an ETA over an export's steps (tqdm, on a terminal only).

The ETA comes from the previous export's per-step timings (``timings_s`` of its
``export_report.json``): the bar's total is their sum and each finished step advances it by its
expected share, so the remaining time is what the slow steps took last time. A first export has no
ETA (the bar shows elapsed time and steps done).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path

from tritonforge.export.report import REPORT_JSON
from tritonforge.progress import Bar

log = logging.getLogger(__name__)


def log_progress(text: str) -> None:
    """The export's progress lines: INFO records (``--log-level warning`` silences them)."""
    log.info("%s", text)


def previous_timings(repo: Path, artifacts: Iterable[str]) -> dict[str, float]:
    """Step -> seconds from the first existing report next to one of ``artifacts``."""
    for rel in artifacts:
        report = (repo / rel).parent / REPORT_JSON
        try:
            timings = json.loads(report.read_text()).get("timings_s") or {}
        except (OSError, ValueError):
            continue
        return {str(k): float(v) for k, v in timings.items() if k != "total"}
    return {}


class StepBar:
    """``advance(step, seconds)`` after each step; ``write`` logs a progress line (above the
    bar on a terminal)."""

    def __init__(
        self, spec: str, expected: Mapping[str, float], enabled: bool | None = None
    ) -> None:
        self.expected = dict(expected)
        total = sum(self.expected.values()) or None
        self.bar = Bar(
            f"export {spec}",
            round(total, 1) if total else None,
            unit="s",
            bar_format=(
                "{desc}: {percentage:3.0f}%|{bar}| {elapsed} elapsed, ~{remaining} left"
                if total
                else "{desc}: {n:.0f} steps, {elapsed} elapsed"
            ),
            enabled=enabled,
        )

    def advance(self, step: str, seconds: float) -> None:
        if self.bar.bar.total:
            self.bar.update_to(self.bar.n + self.expected.get(step, 0.0))
        else:
            self.bar.update(1)

    def write(self, text: str) -> None:
        log_progress(text)

    def close(self) -> None:
        self.bar.close()
