"""What runs in a server's process group, read through ``psutil``: live members, Python stubs by
model instance, and where its shared-memory regions are."""

from __future__ import annotations

import os
from pathlib import Path

import psutil

SHM_DIR = Path("/dev/shm")
STUB_BINARY = "triton_python_backend_stub"


def group_members(pgid: int) -> list[int]:
    """PIDs in process group ``pgid`` that are alive (zombies excluded), in PID order."""
    alive: list[int] = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except (OSError, psutil.Error):  # gone meanwhile, or not ours to look at
            continue
    return alive


def python_stubs(pids: list[int]) -> dict[str, tuple[int, str]]:
    """Model instance name (e.g. ``tokenizer_0_0``) -> (PID, model name) of each Python backend
    stub among ``pids``. While a reload overlaps the old instance with its new one (same name),
    the newest process wins: the old one is about to exit."""
    result: dict[str, tuple[int, str]] = {}
    started: dict[str, float] = {}
    for pid in pids:
        try:
            process = psutil.Process(pid)
            args, created_s = process.cmdline(), process.create_time()
        except psutil.Error:
            continue
        # 2.51 stub argv: stub, <repo>/<model>/<version>/<file>, shm region, default size, growth
        # size, parent pid, lib dir, ipc handle, instance name, python-based backend dir
        if args and args[0].endswith(STUB_BINARY) and len(args) > 8:
            name = args[8]
            if name in started and started[name] > created_s:
                continue
            started[name] = created_s
            result[name] = (pid, Path(args[1]).parent.parent.name)
    return result


def shm_dir(pid: int | None, namespaced: bool) -> Path:
    """Where a server's shared-memory regions live: the private tmpfs of its mount namespace
    (seen through ``/proc/<pid>/root``) or the host's /dev/shm."""
    if namespaced and pid is not None:
        return Path(f"/proc/{pid}/root/dev/shm")
    return SHM_DIR


def shm_regions(directory: Path, prefix: str) -> list[Path]:
    """Regions named ``prefix*`` in ``directory``; [] once a namespace (and its tmpfs) is gone."""
    try:
        return sorted(directory.glob(f"{prefix}*"))
    except OSError:
        return []
