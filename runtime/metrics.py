"""Triton's Prometheus metrics endpoint: its URL, a bind probe that names the flag when the port
is taken, and draining (nothing queued or in flight) read from the metrics."""

from __future__ import annotations

import socket
from collections.abc import Callable

from tritonforge.drain import fetch_metrics, wait_until_quiet
from tritonforge.runtime.errors import ServerStartError


def metrics_url(host: str, port: int) -> str:
    return f"http://{host}:{port}/metrics"


def check_port_free(host: str, port: int) -> None:
    """Raise :class:`ServerStartError` naming the flag and variable when ``port`` is taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as e:
            raise ServerStartError(
                f"cannot listen on {host}:{port} for metrics ({e.strerror}); "
                "pass --metrics-port or set TRITONFORGE_METRICS_PORT"
            ) from e


def drain(
    url: str, timeout_s: float, quiet_s: float = 0.5, alive: Callable[[], bool] = lambda: True
) -> bool:
    """True once no request is queued and none completed for ``quiet_s``; False when traffic did
    not stop within ``timeout_s`` or ``alive()`` turned False (see :mod:`tritonforge.drain`)."""
    return wait_until_quiet(lambda: fetch_metrics(url), timeout_s, quiet_s, alive=alive)
