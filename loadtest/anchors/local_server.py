"""A peer server (llama.cpp's ``llama-server``, Infinity's ``infinity_emb``) run as a local
process for a bench: started on a free loopback port with its output in a log file, waited on
until its health URL answers 200, stopped with SIGTERM (SIGKILL after ``stop_timeout_s``)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO


def free_port() -> int:
    """A loopback port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def healthy(url: str, timeout_s: float = 2.0) -> bool:
    """True when ``GET url`` answers 200 within ``timeout_s``."""
    with (
        contextlib.suppress(OSError, urllib.error.URLError),
        urllib.request.urlopen(url, timeout=timeout_s) as r,
    ):
        return bool(r.status == 200)
    return False


class LocalServer:
    """One peer server process. :meth:`start` raises ``error`` (the anchor's own exception) when
    the process exits first (with its log's tail) or is not healthy within ``ready_timeout_s``;
    its ``health_url`` may be a function giving None until the URL is known (a server on port 0
    that says in its log which port it bound)."""

    def __init__(self, name: str, error: type[Exception]) -> None:
        self.name = name
        self.error = error
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        self._log: IO[bytes] | None = None

    def start(
        self,
        cmd: Sequence[str],
        log_path: Path,
        health_url: str | Callable[[], str | None],
        ready_timeout_s: float,
        poll_interval_s: float = 0.5,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            list(cmd),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else dict(os.environ),
        )
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                code = self.proc.returncode
                self.stop()
                raise self.error(f"{self.name} exited {code}: {tail}")
            url = health_url() if callable(health_url) else health_url
            if url is not None and healthy(url):
                return
            time.sleep(poll_interval_s)
        self.stop()
        raise self.error(
            f"{self.name} not healthy after {ready_timeout_s} s; its output: {log_path} (a slow "
            "host may need a longer ready timeout)"
        )

    def stop(self, stop_timeout_s: float = 15.0) -> None:
        """Terminate the process (kill it after ``stop_timeout_s``) and close its log; idempotent."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=stop_timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
        self.proc, self._log = None, None
