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


def accepts_connections(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """Whether something listens on ``host:port`` (a TCP connect succeeds)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def drain(
    url: str, timeout_s: float, quiet_s: float = 0.5, alive: Callable[[], bool] = lambda: True
) -> bool:
    """True once no request is queued and none completed for ``quiet_s``; False when traffic did
    not stop within ``timeout_s`` or ``alive()`` turned False (see :mod:`tritonforge.drain`)."""
    return wait_until_quiet(lambda: fetch_metrics(url), timeout_s, quiet_s, alive=alive)


class MetricsProxy:
    """The public metrics port, held by the launcher for the server's whole life.

    tritonserver binds the port given to ``--metrics-port`` itself, so while the supervisor
    restarts it the port is free and another process could take it (and the restarts then
    fail). Behind the front, Triton's metrics listen on a loopback port picked per launch
    (``upstream_port()``), and this proxy, bound once before the first start, forwards
    ``GET /metrics`` there (503 while Triton is down)."""

    def __init__(
        self,
        host: str,
        port: int,
        upstream_port: Callable[[], int | None],
        timeout_s: float = 10.0,
        extra: Callable[[], str] | None = None,
    ) -> None:
        """``extra()``: Prometheus text appended to Triton's on ``/metrics`` (the front's
        gauges)."""
        import threading
        import urllib.error
        import urllib.request
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            timeout = timeout_s

            def do_GET(self) -> None:
                upstream = upstream_port()
                if upstream is None:
                    self.send_error(503, "tritonserver is restarting")
                    return
                try:
                    url = f"http://127.0.0.1:{upstream}{self.path}"
                    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
                        status, body = resp.status, resp.read()
                        content_type = resp.headers.get("Content-Type", "text/plain")
                    if extra is not None and status == 200 and self.path.startswith("/metrics"):
                        body += extra().encode()
                except urllib.error.HTTPError as e:
                    status, body, content_type = e.code, e.read(), "text/plain"
                except OSError:
                    self.send_error(503, "tritonserver is restarting")
                    return
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True

            def handle_error(self, request: object, client_address: object) -> None:
                return  # a client that went away mid-answer is routine

        try:
            self.httpd = Server((host, port), Handler)
        except OSError as e:
            raise ServerStartError(
                f"cannot listen on {host}:{port} for metrics ({e.strerror}); "
                "pass --metrics-port or set TRITONFORGE_METRICS_PORT"
            ) from e
        self.port = int(self.httpd.server_address[1])
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="metrics-proxy", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
