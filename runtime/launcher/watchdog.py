"""Launcher-death watchdog: ``python -m tritonforge.runtime.launcher.watchdog PGID SHM_PREFIX DIR...``.

Started by :class:`runtime.launcher.server.TritonLauncher` for each tritonserver it launches, in its own
session, with a pipe on stdin whose write end only the launcher holds. The launcher writes ``done``
after a clean stop. End of file without ``done`` means the launcher died (``kill -9``, OOM): the
watchdog then stops tritonserver's process group (SIGTERM, SIGKILL after ``GRACE_S``), unlinks its
``/dev/shm`` regions and removes its work directories, so nothing keeps serving unsupervised.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
from pathlib import Path

GRACE_S = 5.0


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_up(pgid: int, shm_prefix: str, dirs: list[str]) -> None:
    """Stop the process group and remove what it leaves behind."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    for region in Path("/dev/shm").glob(f"{shm_prefix}*"):
        with contextlib.suppress(FileNotFoundError):
            region.unlink()
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the launcher's to handle
    pgid, shm_prefix, dirs = int(argv[0]), argv[1], argv[2:]
    received = b""
    while chunk := os.read(0, 64):
        received += chunk
    if b"done" not in received:
        clean_up(pgid, shm_prefix, dirs)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
