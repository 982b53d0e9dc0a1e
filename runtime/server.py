"""Start, watch and stop the embedded tritonserver.

:class:`EmbeddedServer` is both what ``python -m tritonforge.runtime serve`` runs and the context manager the
tests use: free ports, a readiness poll that reports model load errors by name, and a teardown
that waits for the process group to exit and removes its shared-memory regions.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import NoReturn

from tritonforge.drain import fetch_metrics, wait_until_quiet
from tritonforge.env import env_int
from tritonforge.runtime.errors import ModelLoadError, ServerStartError
from tritonforge.runtime.front import (
    ADMIN_HEADER,
    GRPC_ADMIN_HEADER,
    Front,
    FrontLimits,
    grpc_target,
    http_socket,
    triton_listen_args,
)
from tritonforge.runtime.locate import (
    PYTHONPATH_ENV,
    assemble_backend_dir,
    find_triton,
    library_path,
    venv_paths,
)

SHM_DIR = Path("/dev/shm")
ADMIN_KEY_ENV = "TRITONFORGE_ADMIN_KEY"
RESTRICTED_APIS = (
    "model-repository",
    "model-config",
    "shared-memory",
    "statistics",
    "trace",
    "logging",
)
_FAILED_LOAD = re.compile(r"failed to load '(?P<name>[^']+)' version \d+: (?P<reason>.+?)\"?$")
_FAILED_MODEL = re.compile(r"failed to load model '(?P<name>[^']+)': (?P<reason>.+?)\"?$")
_POLL_FAILED = re.compile(r"Poll failed for model directory '(?P<name>[^']+)': (?P<reason>.+?)\"?$")
_TABLE_ROW = re.compile(r"^\|\s*(?P<name>\S+)\s*\|\s*\d+\s*\|\s*UNAVAILABLE: (?P<reason>.*?)\s*\|$")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _env_int(name: str, default: int) -> int:
    return env_int(name, default)


@dataclass
class ServerSettings:
    """How to run tritonserver. Defaults come from ``TRITONFORGE_*`` environment variables."""

    model_repository: Path
    host: str = field(default_factory=lambda: os.environ.get("TRITONFORGE_HOST", "127.0.0.1"))
    http_port: int = field(default_factory=lambda: _env_int("TRITONFORGE_HTTP_PORT", 8000))
    grpc_port: int = field(default_factory=lambda: _env_int("TRITONFORGE_GRPC_PORT", 8001))
    metrics_port: int = field(default_factory=lambda: _env_int("TRITONFORGE_METRICS_PORT", 8002))
    model_control_mode: str = "none"
    load_models: Sequence[str] = ()
    ready_timeout_s: float = 120.0
    exit_timeout_s: float = 30.0
    log_verbose: int = 0
    echo_log: bool = False
    model_config_name: str | None = None
    extra_args: Sequence[str] = ()
    backend_dir: Path | None = None
    restrict_apis: bool = True
    """Require the admin header for the model-repository, model-config, shared-memory, statistics,
    trace and logging APIs on both protocols (Triton 2.51 ``--*-restricted-api``)."""
    admin_key: str = field(
        default_factory=lambda: os.environ.get(ADMIN_KEY_ENV) or secrets.token_urlsafe(18)
    )
    front: bool = True
    """Triton listens on Unix sockets in a private (0700) directory; the front (runtime/front.py)
    owns the public HTTP/gRPC ports, bounds bodies and checks the admin key. False: Triton binds
    the TCP ports itself (no body bounds; the admin key goes on its command line)."""
    front_limits: FrontLimits = field(default_factory=FrontLimits)
    private_shm: bool = True
    """Run tritonserver in its own mount namespace with a private 0700 tmpfs on /dev/shm (the
    Python backend creates its regions 0644, readable by every local user, whatever the umask);
    falls back to the host's /dev/shm, with a warning, where namespaces are not allowed."""
    shm_limit_bytes: int = field(
        default_factory=lambda: _env_int("TRITONFORGE_SHM_LIMIT_BYTES", 1 << 30)
    )
    """Size of that tmpfs: the bound on all shared-memory regions together."""

    @classmethod
    def ephemeral(cls, model_repository: Path, **kwargs: object) -> ServerSettings:
        """Settings on free loopback ports, for tests and benchmarks."""
        for key in ("http_port", "grpc_port", "metrics_port"):
            kwargs.setdefault(key, free_port())
        return cls(model_repository=model_repository, host="127.0.0.1", **kwargs)  # type: ignore[arg-type]


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


class EmbeddedServer:
    """One tritonserver process (and its Python stubs) in its own process group."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.shm_prefix = f"tritonforge_{os.getpid()}_{secrets.token_hex(4)}_"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: collections.deque[str] = collections.deque(maxlen=4000)
        self._log_lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self._workdir = Path(tempfile.mkdtemp(prefix="tritonforge-"))
        # Triton's Unix sockets; mkdtemp makes it 0700, so other users cannot connect. Kept across
        # restarts (the front reads the paths per request).
        self.socket_dir = Path(tempfile.mkdtemp(prefix="tritonforge-sock-"))
        self._front: Front | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._namespaced = False
        self.restarting = False

    # -- addresses ---------------------------------------------------------------------------
    @property
    def http_url(self) -> str:
        return f"{self._client_host}:{self.settings.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self._client_host}:{self.settings.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self._client_host}:{self.settings.metrics_port}/metrics"

    @property
    def _client_host(self) -> str:
        return "127.0.0.1" if self.settings.host in ("0.0.0.0", "") else self.settings.host

    @property
    def admin_headers(self) -> dict[str, str]:
        """HTTP headers that unlock the restricted APIs."""
        return {ADMIN_HEADER: self.settings.admin_key}

    @property
    def admin_grpc_headers(self) -> dict[str, str]:
        """gRPC metadata that unlocks the restricted APIs (Triton prefixes the key for gRPC)."""
        return {GRPC_ADMIN_HEADER: self.settings.admin_key}

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc else None

    @property
    def http_socket(self) -> Path:
        """Triton's private HTTP socket (behind the front)."""
        return http_socket(self.socket_dir)

    @property
    def grpc_target(self) -> str:
        """Triton's private gRPC address (2.51 appends ``:<port>`` to the socket path)."""
        return grpc_target(self.socket_dir)

    def log_text(self, last: int | None = None) -> str:
        with self._log_lock:
            lines = list(self._log)
        return "\n".join(lines[-last:] if last else lines)

    # -- lifecycle ---------------------------------------------------------------------------
    def command(self) -> list[str]:
        s = self.settings
        install = find_triton()
        backend_dir = s.backend_dir or (self._workdir / "backends")
        assemble_backend_dir(install, backend_dir)
        cmd = [
            str(install.binary),
            f"--model-repository={Path(s.model_repository).resolve()}",
            f"--backend-directory={backend_dir}",
            *self._listen_args(),
            f"--metrics-address={s.host}",
            f"--metrics-port={s.metrics_port}",
            "--allow-gpu-metrics=false",
            "--allow-cpu-metrics=true",
            "--pinned-memory-pool-byte-size=0",
            "--strict-readiness=true",
            f"--exit-timeout-secs={int(s.exit_timeout_s)}",
            f"--model-control-mode={s.model_control_mode}",
            f"--log-verbose={s.log_verbose}",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            "--backend-config=python,shm-default-byte-size=4194304",
        ]
        if s.restrict_apis and not s.front:
            apis = ",".join(RESTRICTED_APIS)
            cmd += [
                f"--http-restricted-api={apis}:{ADMIN_HEADER}={s.admin_key}",
                f"--grpc-restricted-protocol={apis}:{ADMIN_HEADER}={s.admin_key}",
            ]
        if s.model_config_name:
            cmd.append(f"--model-config-name={s.model_config_name}")
        load_models = list(s.load_models)
        if s.model_control_mode == "explicit" and not load_models:
            load_models = ["*"]  # explicit control, but start with the whole repository loaded
        cmd += [f"--load-model={m}" for m in load_models]
        cmd += list(s.extra_args)
        return cmd

    def _listen_args(self) -> list[str]:
        s = self.settings
        if s.front:
            return triton_listen_args(self.socket_dir)
        return [
            f"--http-address={s.host}",
            f"--http-port={s.http_port}",
            f"--grpc-address={s.host}",
            f"--grpc-port={s.grpc_port}",
        ]

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != ADMIN_KEY_ENV}
        env["LD_LIBRARY_PATH"] = library_path(find_triton())
        env[PYTHONPATH_ENV] = os.pathsep.join(venv_paths())
        # Models run their own thread pools; keep BLAS from oversubscribing the cores.
        env.setdefault("OMP_NUM_THREADS", "1")
        # Large blocks straight from mmap, returned on free: PyTorch's variable-shape activations
        # otherwise fragment glibc's heap and the TorchScript stub's RSS creeps up (`make soak`:
        # 9.9 -> 1.8 MB per 10k requests).
        env.setdefault("MALLOC_MMAP_THRESHOLD_", "131072")
        env.setdefault("MALLOC_TRIM_THRESHOLD_", "131072")
        return env

    def start(self) -> EmbeddedServer:
        """Launch tritonserver; returns at once (see :meth:`wait_ready`)."""
        if self._proc is not None:
            raise ServerStartError("server already started")
        try:
            self._check_metrics_port()
            if self.settings.front and self._front is None:
                self._front = self._make_front().start()  # binds the public ports first
        except BaseException:
            if not self.restarting:  # nothing started: leave no directory behind
                shutil.rmtree(self.socket_dir, ignore_errors=True)
                shutil.rmtree(self._workdir, ignore_errors=True)
            raise
        for stale in self.socket_dir.glob("*.sock*"):
            stale.unlink()
        command = self.command()
        if self.settings.private_shm:
            prefix = namespace_prefix(self.settings.shm_limit_bytes)
            if not prefix:
                print(
                    "warning: cannot create a private mount namespace (unshare); shared-memory "
                    "regions are in the host's /dev/shm, readable by other local users",
                    file=sys.stderr,
                )
            self._namespaced = bool(prefix)
            command = prefix + command
        try:
            self._proc = subprocess.Popen(
                command,
                env=self.environment(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                umask=0o077,  # shm regions, sockets and files: owner only
            )
        except BaseException:
            self.stop()
            raise
        self._watchdog = subprocess.Popen(
            [sys.executable, "-m", "tritonforge.runtime.watchdog", str(self._proc.pid), self.shm_prefix,
             str(self._workdir), str(self.socket_dir)],
            stdin=subprocess.PIPE,
            cwd=Path(__file__).resolve().parent.parent,
            start_new_session=True,
        )  # fmt: skip
        self._reader = threading.Thread(target=self._pump, name="tritonserver-log", daemon=True)
        self._reader.start()
        return self

    def _make_front(self) -> Front:
        s = self.settings
        return Front(
            s.host,
            s.http_port,
            s.grpc_port,
            http_socket=lambda: self.http_socket,
            grpc_target=lambda: self.grpc_target,
            admin_key=s.admin_key if s.restrict_apis else None,
            admin_header=ADMIN_HEADER,
            grpc_admin_headers=(GRPC_ADMIN_HEADER, ADMIN_HEADER),
            limits=s.front_limits,
        )

    def _check_metrics_port(self) -> None:
        """Fail at once, naming the flag, when the metrics port is taken."""
        s = self.settings
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((s.host, s.metrics_port))
            except OSError as e:
                raise ServerStartError(
                    f"cannot listen on {s.host}:{s.metrics_port} for metrics ({e.strerror}); "
                    "pass --metrics-port or set TRITONFORGE_METRICS_PORT"
                ) from e

    def _pump(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for raw in self._proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self._log_lock:
                self._log.append(line)
            if self.settings.echo_log:
                print(line, file=sys.stderr, flush=True)

    def is_ready(self, timeout_s: float = 2.0) -> bool:
        try:
            url = f"http://{self.http_url}/v2/health/ready"
            with urllib.request.urlopen(url, timeout=timeout_s) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def load_failures(self) -> dict[str, str]:
        """Model name -> Triton's error, parsed from the server log."""
        failures: dict[str, str] = {}
        for line in self.log_text().splitlines():
            for pattern in (_FAILED_LOAD, _FAILED_MODEL, _POLL_FAILED, _TABLE_ROW):
                m = pattern.search(line.strip())
                if m:
                    failures.setdefault(m.group("name"), m.group("reason").strip())
        return failures

    def wait_ready(
        self, timeout_s: float | None = None, cancel: threading.Event | None = None
    ) -> EmbeddedServer:
        """Block until ``/v2/health/ready`` answers 200.

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
                self._drain()
                self._fail(
                    f"tritonserver exited with status {self.returncode} before becoming ready"
                )
            if self.is_ready():
                return self
            time.sleep(0.2)
        self._fail(
            f"tritonserver was not ready after {timeout_s:.0f} s (raise --ready-timeout-s for "
            "slow models)"
        )

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
        hint = ""
        if "already in use" in tail.lower():
            hint = (
                " (a port is taken: pass --http-port/--grpc-port/--metrics-port or set "
                "TRITONFORGE_HTTP_PORT/_GRPC_PORT/_METRICS_PORT)"
            )
        raise ServerStartError(f"{why}{hint}; last log lines:\n{tail}")

    def repository_call(self, path: str, body: bytes = b"{}", timeout_s: float = 120.0) -> str:
        """POST to the model-repository API (with the admin header); returns the error text or ""."""
        request = urllib.request.Request(
            f"http://{self.http_url}/v2/repository/{path}",
            data=body,
            method="POST",
            headers={**self.admin_headers, "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s):
                return ""
        except urllib.error.HTTPError as e:
            return e.read().decode("utf-8", "replace") or str(e)

    def load_model(self, model: str, timeout_s: float = 120.0, force: bool = False) -> None:
        """(Re)load ``model`` through the repository API (explicit model control only).

        Triton loads the new instances before it retires the old ones, so requests keep being
        served; raises :class:`ModelLoadError` with Triton's error when the load fails (the
        versions already serving stay). Triton skips a load when nothing changed on disk;
        ``force`` passes the current config as an override so the instances are rebuilt (what a
        crashed stub needs).
        """
        body = b"{}"
        if force:
            request = urllib.request.Request(
                f"http://{self.http_url}/v2/models/{model}/config", headers=self.admin_headers
            )
            with urllib.request.urlopen(request, timeout=10) as resp:
                config = resp.read().decode()
            body = json.dumps({"parameters": {"config": config}}).encode()
        error = self.repository_call(f"models/{model}/load", body=body, timeout_s=timeout_s)
        if error:
            raise ModelLoadError({model: error})

    def drain(self, timeout_s: float, quiet_s: float = 0.5) -> bool:
        """Wait until no request is queued and none completed for ``quiet_s`` (nothing in flight).

        Triton 2.51 stops every model's scheduler on SIGTERM, which fails ensemble/BLS requests
        caught between two stages (server#6287); draining first lets them finish. Returns False
        when traffic did not stop within ``timeout_s``. The container does the same
        (:mod:`tritonforge.drain`).
        """
        return wait_until_quiet(
            lambda: fetch_metrics(self.metrics_url),
            timeout_s,
            quiet_s,
            alive=lambda: self.returncode is None,
        )

    def restart(self, stop_timeout_s: float = 5.0) -> EmbeddedServer:
        """Stop (bounded: in-flight requests of a dead stub never finish) and start again on the
        same ports and settings; returns when ready."""
        self.restarting = True
        try:
            self._stop_triton(timeout_s=stop_timeout_s)
            self._proc = None
            self._workdir = Path(tempfile.mkdtemp(prefix="tritonforge-"))
            self.shm_prefix = f"tritonforge_{os.getpid()}_{secrets.token_hex(4)}_"
            with self._log_lock:
                self._log.clear()
            self.start()
            return self.wait_ready()
        finally:
            self.restarting = False

    def _drain(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=5)

    def stop(self, timeout_s: float | None = None) -> int | None:
        """Stop tritonserver (see :meth:`_stop_triton`) and close the front's ports."""
        code = self._stop_triton(timeout_s)
        if self._front is not None:
            self._front.stop()
            self._front = None
        shutil.rmtree(self.socket_dir, ignore_errors=True)
        shutil.rmtree(self._workdir, ignore_errors=True)
        return code

    def _stop_triton(self, timeout_s: float | None = None) -> int | None:
        """SIGTERM, wait for a graceful exit, then kill stragglers; remove shared memory."""
        proc = self._proc
        if proc is None:
            return None
        timeout_s = self.settings.exit_timeout_s + 10 if timeout_s is None else timeout_s
        if self._front is not None:
            self._front.release_upstream()
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        self._drain()
        self._cleanup()
        return proc.returncode

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
        shutil.rmtree(self._workdir, ignore_errors=True)
        if self._watchdog is not None:  # a clean stop: tell the watchdog to leave quietly
            with contextlib.suppress(OSError):
                assert self._watchdog.stdin is not None
                self._watchdog.stdin.write(b"done")
                self._watchdog.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._watchdog.wait(timeout=5)
            self._watchdog = None

    def leftover_processes(self) -> list[int]:
        """PIDs still alive in the server's process group (stubs included)."""
        if self._proc is None:
            return []
        pgid = self._proc.pid
        alive = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    stat = (entry / "stat").read_text()
                    if ") Z" not in stat:
                        alive.append(int(entry.name))
            except (ProcessLookupError, PermissionError, FileNotFoundError, OSError):
                continue
        return alive

    def stubs(self) -> dict[str, tuple[int, str]]:
        """Model instance name (e.g. ``tokenizer_0_0``) -> (PID of its Python stub, model name)."""
        result: dict[str, tuple[int, str]] = {}
        for pid in self.leftover_processes():
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            # 2.51 stub argv: stub, <repo>/<model>/<version>/<file>, shm region, sizes, parent pid,
            # lib dir, ipc handle, instance name, python-based backend dir
            if args and args[0].endswith(b"triton_python_backend_stub") and len(args) > 8:
                model = Path(args[1].decode()).parent.parent.name
                result[args[8].decode()] = (pid, model)
        return result

    def stub_pids(self) -> dict[str, int]:
        """Model instance name -> PID of its Python backend stub."""
        return {name: pid for name, (pid, _) in self.stubs().items()}

    @property
    def shm_dir(self) -> Path:
        """Where the server's regions live: its private tmpfs (seen through /proc) or /dev/shm."""
        if self._namespaced and self._proc is not None:
            return Path(f"/proc/{self._proc.pid}/root/dev/shm")
        return SHM_DIR

    def shm_regions(self) -> list[Path]:
        try:
            return sorted(self.shm_dir.glob(f"{self.shm_prefix}*"))
        except OSError:  # the namespace is gone with its processes, and its tmpfs with it
            return []

    def __enter__(self) -> EmbeddedServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@contextlib.contextmanager
def serving(model_repository: Path, **kwargs: object) -> Iterator[EmbeddedServer]:
    """Serve ``model_repository`` on free loopback ports for the duration of the block."""
    with EmbeddedServer(ServerSettings.ephemeral(model_repository, **kwargs)) as server:
        yield server
