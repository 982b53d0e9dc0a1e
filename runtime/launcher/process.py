"""One launch of tritonserver: its own session and process group, optionally its own mount
namespace with a private /dev/shm, a launcher-death watchdog, its output pumped into a
:class:`~runtime.launcher.logparse.ServerLog`, and a bounded stop that leaves no process, shared-memory
region or work directory behind."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from tritonforge.runtime.launcher import procinfo
from tritonforge.runtime.launcher.logparse import ServerLog

_NAMESPACE_SCRIPT = 'mount -t tmpfs -o mode=0700,size={size} tritonforge-shm /dev/shm && exec "$@"'


def namespace_prefix(shm_limit_bytes: int) -> list[str]:
    """argv prefix that runs a command in a new mount namespace (a user namespace too when not
    root) over a private tmpfs /dev/shm; [] where this system does not allow it."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return []
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    prefix = [
        unshare, "--mount", *user, "--", "/bin/sh", "-c",
        _NAMESPACE_SCRIPT.format(size=int(shm_limit_bytes)), "tritonserver",
    ]  # fmt: skip
    try:
        probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return prefix if probe.returncode == 0 else []


class TritonProcess:
    """One tritonserver process group. Owns a fresh work directory and shm-region prefix (the
    command needs both before :meth:`launch`); a restart is a new instance."""

    def __init__(self, log: ServerLog) -> None:
        self.log = log
        self.workdir = Path(tempfile.mkdtemp(prefix="tritonforge-"))
        self.shm_prefix = f"tritonforge_{os.getpid()}_{secrets.token_hex(4)}_"
        self.namespaced = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._stop_lock = threading.Lock()  # the supervisor and a signal may stop it at once

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc else None

    def launch(
        self,
        command: Sequence[str],
        env: dict[str, str],
        *,
        private_shm: bool,
        shm_limit_bytes: int,
        watch_dirs: Sequence[Path] = (),
    ) -> None:
        """Start ``command``; returns at once. The watchdog removes the work directory and
        ``watch_dirs`` too if this (launching) process dies without stopping the server."""
        argv = list(command)
        if private_shm:
            prefix = namespace_prefix(shm_limit_bytes)
            if not prefix:
                print(
                    "warning: cannot create a private mount namespace (unshare); shared-memory "
                    "regions are in the host's /dev/shm, readable by other local users",
                    file=sys.stderr,
                )
            self.namespaced = bool(prefix)
            argv = prefix + argv
        self._proc = subprocess.Popen(
            argv,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            umask=0o077,  # shm regions, sockets and files: owner only
        )
        self._watchdog = subprocess.Popen(
            [sys.executable, "-m", "tritonforge.runtime.launcher.watchdog", str(self._proc.pid), self.shm_prefix,
             str(self.workdir), *(str(d) for d in watch_dirs)],
            stdin=subprocess.PIPE,
            cwd=Path(__file__).resolve().parent.parent.parent,
            start_new_session=True,
        )  # fmt: skip
        assert self._proc.stdout is not None
        self._reader = threading.Thread(
            target=self.log.pump, args=(self._proc.stdout,), name="tritonserver-log", daemon=True
        )
        self._reader.start()

    def join_log(self) -> None:
        """Wait (bounded) until the output of an exited server is all in the log."""
        if self._reader is not None:
            self._reader.join(timeout=5)

    def stop(self, timeout_s: float) -> int | None:
        """SIGTERM, wait up to ``timeout_s`` for a graceful exit, then kill the group; remove
        shared memory and the work directory. Its exit status (None if never launched).
        Safe to call again or from two threads at once (the second waits, then returns)."""
        with self._stop_lock:
            return self._stop(timeout_s)

    def _stop(self, timeout_s: float) -> int | None:
        proc = self._proc
        if proc is None:
            self.discard()
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        self.join_log()
        self._cleanup()
        return proc.returncode

    def discard(self) -> None:
        """Remove the work directory (nothing was launched, or all is stopped)."""
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _cleanup(self) -> None:
        """Kill anything left in the process group and unlink our shared-memory regions."""
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while self.leftover_processes() and time.monotonic() < deadline:
            time.sleep(0.1)
        for region in self.shm_regions():
            with contextlib.suppress(FileNotFoundError):
                region.unlink()
        self.discard()
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:  # a clean stop: tell the watchdog to leave quietly
            # ValueError: its pipe is already closed (written to closed file before)
            with contextlib.suppress(OSError, ValueError):
                assert watchdog.stdin is not None
                watchdog.stdin.write(b"done")
                watchdog.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                watchdog.wait(timeout=5)

    def leftover_processes(self) -> list[int]:
        """PIDs still alive in the server's process group (stubs included)."""
        return procinfo.group_members(self._proc.pid) if self._proc is not None else []

    @property
    def shm_dir(self) -> Path:
        """Where the server's regions live: its private tmpfs (seen through /proc) or /dev/shm."""
        return procinfo.shm_dir(self.pid, self.namespaced)

    def shm_regions(self) -> list[Path]:
        return procinfo.shm_regions(self.shm_dir, self.shm_prefix)
