"""What this machine's CPU is, read once from ``/proc/cpuinfo`` (psutil has no instruction-set
flags): the first CPU's ``flags`` and ``model name``. Standard library only."""

from __future__ import annotations

from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def _field(name: str, cpuinfo: Path) -> str | None:
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return None


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The first CPU's instruction-set flags (empty when ``cpuinfo`` is unreadable)."""
    return frozenset((_field("flags", cpuinfo) or "").split())


def cpu_model(cpuinfo: Path = CPUINFO) -> str:
    """The first CPU's model name ("unknown" when ``cpuinfo`` is unreadable)."""
    return _field("model name", cpuinfo) or "unknown"
