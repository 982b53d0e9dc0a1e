"""Start, watch and stop the embedded tritonserver.

:class:`TritonLauncher` runs one tritonserver: free ports, a readiness poll that reports model load
errors by name, and a teardown that waits for the process group to exit and removes its
shared-memory regions. It builds no front: the front it runs before Triton's sockets is given
(``front``, a :data:`FrontFactory`); :mod:`runtime.serving` composes the two.

It composes units with one job each: :mod:`~runtime.launcher.settings` (what to run),
:mod:`~runtime.launcher.command` (the command line), :mod:`~runtime.launcher.process` (one launch and its stop),
:mod:`~runtime.launcher.logparse` (the log and the load failures in it), :mod:`~runtime.launcher.procinfo` (the
process group through psutil), :mod:`~runtime.launcher.repository_api` (readiness, model loads) and
:mod:`~runtime.launcher.metrics` (the metrics port and draining).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NoReturn, Protocol, TypeVar

from tritonforge.headers import ADMIN_HEADER, GRPC_ADMIN_HEADER
from tritonforge.runtime.errors import ModelLoadError, ServerStartError
from tritonforge.runtime.front.settings import grpc_target, http_socket
from tritonforge.runtime.launcher import metrics, procinfo, repository_api
from tritonforge.runtime.launcher.command import triton_command, triton_environment
from tritonforge.runtime.launcher.locate import assemble_backend_dir, find_triton
from tritonforge.runtime.launcher.logparse import ServerLog, load_failures, port_hint
from tritonforge.runtime.launcher.planned_loads import PlannedLoads
from tritonforge.runtime.launcher.process import TritonProcess
from tritonforge.runtime.launcher.repository_api import RepositoryAPI
from tritonforge.runtime.launcher.settings import ServerSettings, free_port

SHM_DIR = procinfo.SHM_DIR


class PublicFront(Protocol):
    """What the launcher asks of the front it runs before Triton's sockets (started: its public
    ports bound)."""

    http_port: int
    grpc_port: int

    def metrics(self) -> str: ...
    def release_upstream(self) -> None: ...
    def begin_drain(self) -> None: ...
    def wait_idle(self, timeout_s: float) -> bool: ...
    def end_streams(
        self, models: Iterable[str], reason: str, opened_before_s: float | None = None
    ) -> int: ...
    def stop(self) -> None: ...


FrontFactory = Callable[["TritonLauncher"], PublicFront]
"""Builds and starts the front of a launcher (its settings and sockets); called once."""


_L = TypeVar("_L", bound="TritonLauncher")  # a subclass's own type (Python 3.10: no Self)


class TritonLauncher:
    """One tritonserver process (and its Python stubs) in its own process group, behind the
    front ``front`` builds when ``settings.front``; a context manager that starts it, waits until
    ready and stops it."""

    def __init__(self, settings: ServerSettings, front: FrontFactory | None = None) -> None:
        self.settings = settings
        self._front_factory = front
        self._log = ServerLog(echo=settings.echo_log)
        self._process: TritonProcess | None = None
        # Triton's Unix sockets; mkdtemp makes it 0700, so other users cannot connect. Kept across
        # restarts (the front reads the paths per request).
        self.socket_dir = Path(tempfile.mkdtemp(prefix="tritonforge-sock-"))
        self._front: PublicFront | None = None
        self._metrics_proxy: metrics.MetricsProxy | None = None
        self._triton_metrics_port: int | None = None
        # One lifecycle operation at a time: the supervisor's restart and the launcher's stop
        # (a signal) may race; both stop the same process.
        self._lifecycle = threading.RLock()
        self._stopping = threading.Event()  # set by stop(): a restart under way gives up waiting
        self.restarting = False
        self.planned = PlannedLoads()  # loads made on purpose: their stubs' exits are no crash

    # -- addresses ---------------------------------------------------------------------------
    @property
    def http_url(self) -> str:
        return f"{self.settings.client_host}:{self.settings.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.settings.client_host}:{self.settings.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return metrics.metrics_url(self.settings.client_host, self.settings.metrics_port)

    @property
    def admin_headers(self) -> dict[str, str]:
        """HTTP headers that unlock the restricted APIs."""
        return {ADMIN_HEADER: self.settings.admin_key}

    @property
    def admin_grpc_headers(self) -> dict[str, str]:
        """gRPC metadata that unlocks the restricted APIs (Triton prefixes the key for gRPC)."""
        return {GRPC_ADMIN_HEADER: self.settings.admin_key}

    @property
    def http_socket(self) -> Path:
        """Triton's private HTTP socket (behind the front)."""
        return http_socket(self.socket_dir)

    @property
    def grpc_target(self) -> str:
        """Triton's private gRPC address (2.51 appends ``:<port>`` to the socket path)."""
        return grpc_target(self.socket_dir)

    # -- the process -------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def returncode(self) -> int | None:
        return self._process.returncode if self._process else None

    @property
    def shm_prefix(self) -> str | None:
        """Name prefix of this launch's shared-memory regions (None before the first start)."""
        return self._process.shm_prefix if self._process else None

    def leftover_processes(self) -> list[int]:
        """PIDs still alive in the server's process group (stubs included)."""
        return self._process.leftover_processes() if self._process else []

    def stubs(self) -> dict[str, tuple[int, str]]:
        """Model instance name (e.g. ``tokenizer_0_0``) -> (PID of its Python stub, model name)."""
        return procinfo.python_stubs(self.leftover_processes())

    def stub_pids(self) -> dict[str, int]:
        """Model instance name -> PID of its Python backend stub."""
        return {name: pid for name, (pid, _) in self.stubs().items()}

    def shm_regions(self) -> list[Path]:
        return self._process.shm_regions() if self._process else []

    # -- the log -----------------------------------------------------------------------------
    def log_text(self, last: int | None = None) -> str:
        return self._log.text(last)

    def load_failures(self) -> dict[str, str]:
        """Model name -> Triton's error, parsed from the server log."""
        return load_failures(self._log.text())

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self: _L) -> _L:
        """Launch tritonserver; returns at once (see :meth:`wait_ready`). Behind the front, the
        public ports (HTTP, gRPC, metrics) are bound once, here, and held across restarts."""
        self._stopping.clear()
        with self._lifecycle:
            return self._start()

    def _start(self: _L) -> _L:
        if self._process is not None:
            raise ServerStartError("server already started")
        s = self.settings
        try:
            if not s.front:
                metrics.check_port_free(s.host, s.metrics_port)
            elif self._metrics_proxy is None:
                self._metrics_proxy = metrics.MetricsProxy(
                    s.host,
                    s.metrics_port,
                    lambda: self._triton_metrics_port,
                    extra=self._front_metrics,
                )
            if s.front and self._front is None:
                self._front = self._make_front()  # binds the public ports first
            if s.front:  # port 0 asked for any free port: from now on the bound ones
                assert self._front is not None and self._metrics_proxy is not None
                s.http_port, s.grpc_port = self._front.http_port, self._front.grpc_port
                s.metrics_port = self._metrics_proxy.port
        except BaseException:
            if self._metrics_proxy is not None and not self.restarting:
                self._metrics_proxy.stop()
                self._metrics_proxy = None
            if not self.restarting:  # nothing started: leave no directory behind
                shutil.rmtree(self.socket_dir, ignore_errors=True)
            raise
        for stale in self.socket_dir.glob("*.sock*"):
            stale.unlink()
        self._process = process = TritonProcess(self._log)
        try:
            install = find_triton()
            backend_dir = s.backend_dir or (process.workdir / "backends")
            assemble_backend_dir(install, backend_dir)
            private_metrics = None
            if s.front:  # a fresh private port per launch: a stale one cannot block a restart
                self._triton_metrics_port = free_port("127.0.0.1")
                private_metrics = ("127.0.0.1", self._triton_metrics_port)
            command = triton_command(
                s, install.binary, backend_dir, self.socket_dir, process.shm_prefix,
                private_metrics,
            )  # fmt: skip
            process.launch(
                command,
                triton_environment(install),
                private_shm=s.private_shm,
                shm_limit_bytes=s.shm_limit_bytes,
                watch_dirs=[self.socket_dir],
            )
        except BaseException:
            self.stop()
            raise
        return self

    def _front_metrics(self) -> str:
        """The front's gauges (open streams and their bound per model), for ``/metrics``."""
        front = self._front
        return front.metrics() if front is not None else ""

    def _make_front(self) -> PublicFront:
        if self._front_factory is None:
            raise ServerStartError(
                "settings.front is on but this launcher was given no front: build it with "
                "tritonforge.runtime.serving.EmbeddedServer (or set front=False)"
            )
        return self._front_factory(self)

    def is_ready(self, timeout_s: float = 2.0) -> bool:
        """Triton's ``/v2/health/ready`` (behind the front: on its private socket, so a flood
        holding the front's upstream connections cannot hide it)."""
        return repository_api.is_ready(self.http_url, timeout_s, self._direct_socket())

    def _direct_socket(self) -> Path | None:
        return self.http_socket if self.settings.front else None

    @property
    def direct_grpc_url(self) -> str:
        """Where the launcher's own gRPC calls go: Triton's private socket behind the front (a
        connection of their own, past the front's limits), else the public port."""
        return self.grpc_target if self.settings.front else self.grpc_url

    def refresh_front(self) -> None:
        """Give the front fresh upstream connections (a gRPC channel that failed to connect while
        Triton restarted backs off for up to minutes and answers UNAVAILABLE meanwhile)."""
        if self._front is not None:
            self._front.release_upstream()

    def wait_ready(
        self: _L, timeout_s: float | None = None, cancel: threading.Event | None = None
    ) -> _L:
        """Block until ``/v2/health/ready`` answers 200 and, behind the front, Triton's own
        metrics listener accepts connections (it may come up after readiness; the metrics proxy
        answers 503 until it does).

        Raises :class:`ModelLoadError` naming each model that failed (Triton exits when a model
        fails to load with ``--model-control-mode=none``) and :class:`ServerStartError` on timeout.
        Returns early (not ready) when ``cancel`` is set.
        """
        timeout_s = self.settings.ready_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if cancel is not None and cancel.is_set():
                return self
            if self.returncode is not None:
                if self._process is not None:
                    self._process.join_log()
                self._fail(
                    f"tritonserver exited with status {self.returncode} before becoming ready"
                )
            if self.is_ready() and self._metrics_listening():
                return self
            time.sleep(0.2)
        self._fail(
            f"tritonserver was not ready after {timeout_s:.0f} s (raise --ready-timeout-s for "
            "slow models)"
        )

    def _metrics_listening(self) -> bool:
        """Behind the metrics proxy: whether Triton's own metrics listener accepts connections
        (Triton answers ready before that listener is up; until it is, the proxy answers 503)."""
        port = self._triton_metrics_port
        return port is None or metrics.accepts_connections("127.0.0.1", port)

    def _fail(self, why: str) -> NoReturn:
        """Stop, then raise :class:`ModelLoadError` naming failed models, else ServerStartError."""
        failures = self.load_failures()
        tail = self.log_text(last=40)
        if self.restarting:
            self._stop_triton(timeout_s=5.0)  # keep the front: the supervisor tries again
        else:
            self.stop()
        if failures:
            raise ModelLoadError(failures, tail)
        raise ServerStartError(f"{why}{port_hint(tail)}; last log lines:\n{tail}")

    def load_model(self, model: str, timeout_s: float = 120.0, force: bool = False) -> None:
        """(Re)load ``model`` (explicit model control only); see :meth:`RepositoryAPI.load_model`.
        Recorded in :attr:`planned`: the stubs it retires did not crash."""
        with self.planned.loading([model]):
            self._repository().load_model(model, timeout_s, force)

    def _repository(self) -> RepositoryAPI:
        return RepositoryAPI(self.http_url, self.admin_headers, self._direct_socket())

    def drain(self, timeout_s: float, quiet_s: float = 0.5) -> bool:
        """Wait until no request is queued and none completed for ``quiet_s`` (nothing in flight).

        Triton 2.51 stops every model's scheduler on SIGTERM, which fails ensemble/BLS requests
        caught between two stages (server#6287); draining first lets them finish. Returns False
        when traffic did not stop within ``timeout_s``. The container does the same
        (:mod:`tritonforge.drain`).
        """
        return metrics.drain(
            self.metrics_url, timeout_s, quiet_s, alive=lambda: self.returncode is None
        )

    def drain_front(self, timeout_s: float) -> bool:
        """Shutdown's first step: the front refuses every new request (503 / UNAVAILABLE, so
        clients never see Triton's NOT_FOUND of a model being unloaded), ends the open streams
        with a last message saying why, and waits up to ``timeout_s`` for the requests in flight
        to finish, at the front and then in Triton (:meth:`drain`, which also waits for the
        generate engine's sequences to end). Without a front, waits for Triton's own traffic to stop (:meth:`drain`).
        False when requests were still in flight at the timeout."""
        if self._front is None:
            return self.drain(timeout_s)
        deadline = time.monotonic() + timeout_s
        self._front.begin_drain()
        idle = self._front.wait_idle(timeout_s)
        # The front's ended streams cancel their upstream requests, but a decoupled model stops
        # decoding only at its next step: SIGTERM before that crashed tritonserver (exit -11).
        # So wait for Triton's own traffic (and the engine's gauges) to stop too.
        quiet = self.drain(max(0.5, deadline - time.monotonic()))
        return idle and quiet

    def end_streams(
        self, models: Iterable[str], reason: str, opened_before_s: float | None = None
    ) -> int:
        """End the front's open streams to ``models`` with a last message saying ``reason``
        (:meth:`Front.end_streams`); how many (0 without a front)."""
        if self._front is None:
            return 0
        return self._front.end_streams(models, reason, opened_before_s)

    def restart(self: _L, stop_timeout_s: float = 5.0) -> _L:
        """Stop (bounded: in-flight requests of a dead stub never finish) and start again on the
        same ports and settings; returns when ready."""
        with self._lifecycle:
            if self._stopping.is_set():
                return self
            self.restarting = True
            try:
                self._stop_triton(timeout_s=stop_timeout_s)
                self._process = None
                self._triton_metrics_port = None
                self._log.clear()
                self._start()
                self.wait_ready(cancel=self._stopping)
                self.refresh_front()  # channels opened while Triton was down are backing off
                return self
            finally:
                self.restarting = False

    def stop(self, timeout_s: float | None = None) -> int | None:
        """Stop tritonserver (see :meth:`_stop_triton`) and close the front's ports."""
        self._stopping.set()
        with self._lifecycle:
            code = self._stop_triton(timeout_s)
            if self._front is not None:
                self._front.stop()
                self._front = None
            if self._metrics_proxy is not None:
                self._metrics_proxy.stop()
                self._metrics_proxy = None
            shutil.rmtree(self.socket_dir, ignore_errors=True)
        return code

    def _stop_triton(self, timeout_s: float | None = None) -> int | None:
        """Release the front's upstream, then stop the process (see :meth:`TritonProcess.stop`)."""
        process = self._process
        if process is None:
            return None
        if process.pid is not None and self._front is not None:
            self._front.release_upstream()
        timeout_s = self.settings.exit_timeout_s + 10 if timeout_s is None else timeout_s
        return process.stop(timeout_s)

    def __enter__(self: _L) -> _L:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Stop the server, whatever ended the block (an exception propagates)."""
        self.stop()
