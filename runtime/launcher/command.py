"""The tritonserver command line and environment for a :class:`~runtime.launcher.settings.ServerSettings`
(pure: nothing is started; the launcher runs what these return)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from tritonforge.headers import ADMIN_HEADER
from tritonforge.runtime.front.settings import triton_listen_args
from tritonforge.runtime.launcher.locate import (
    PYTHONPATH_ENV,
    TritonInstall,
    library_path,
    venv_paths,
)
from tritonforge.runtime.launcher.settings import ADMIN_KEY_ENV, ServerSettings

RESTRICTED_APIS = (
    "model-repository",
    "model-config",
    "shared-memory",
    "statistics",
    "trace",
    "logging",
)


def listen_args(settings: ServerSettings, socket_dir: Path) -> list[str]:
    """Unix sockets in ``socket_dir`` behind the front, else the public TCP ports."""
    s = settings
    if s.front:
        return triton_listen_args(socket_dir)
    return [
        f"--http-address={s.host}",
        f"--http-port={s.http_port}",
        f"--grpc-address={s.host}",
        f"--grpc-port={s.grpc_port}",
    ]


def triton_command(
    settings: ServerSettings,
    binary: Path,
    backend_dir: Path,
    socket_dir: Path,
    shm_prefix: str,
    metrics_address: tuple[str, int] | None = None,
) -> list[str]:
    """argv of tritonserver: repository, listeners, metrics, control mode, Python backend shm
    prefix, restricted APIs (only without the front: the front checks the key itself).
    ``metrics_address`` (host, port) overrides the settings' (behind the launcher's metrics
    proxy, Triton's own metrics listen on a private loopback port)."""
    s = settings
    metrics_host, metrics_port = metrics_address or (s.host, s.metrics_port)
    cmd = [
        str(binary),
        f"--model-repository={Path(s.model_repository).resolve()}",
        f"--backend-directory={backend_dir}",
        *listen_args(s, socket_dir),
        f"--metrics-address={metrics_host}",
        f"--metrics-port={metrics_port}",
        "--allow-gpu-metrics=false",
        "--allow-cpu-metrics=true",
        "--pinned-memory-pool-byte-size=0",
        "--strict-readiness=true",
        f"--exit-timeout-secs={int(s.exit_timeout_s)}",
        f"--model-control-mode={s.model_control_mode}",
        f"--log-verbose={s.log_verbose}",
        # Every config is complete (written by the export): without this the Python backend
        # starts one extra stub per model load only to ask model.py for a config completion,
        # which imports the model's libraries (1.9 s of a `generate` reload at load 10).
        "--disable-auto-complete-config",
        f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
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
    if s.model_control_mode == "explicit" and not load_models and s.load_all:
        load_models = ["*"]  # explicit control, but start with the whole repository loaded
    cmd += [f"--load-model={m}" for m in load_models]
    cmd += list(s.extra_args)
    return cmd


def triton_environment(
    install: TritonInstall, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """``base`` (default: this process's environment) without the admin key, plus Triton's
    libraries, the venv for the stubs and the thread/allocator settings the models need."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k != ADMIN_KEY_ENV}
    env["LD_LIBRARY_PATH"] = library_path(install)
    env[PYTHONPATH_ENV] = os.pathsep.join(venv_paths())
    # Models run their own thread pools; keep BLAS from oversubscribing the cores.
    env.setdefault("OMP_NUM_THREADS", "1")
    # Large blocks straight from mmap, returned on free: PyTorch's variable-shape activations
    # otherwise fragment glibc's heap and the TorchScript stub's RSS creeps up (`make soak`:
    # 9.9 -> 1.8 MB per 10k requests).
    env.setdefault("MALLOC_MMAP_THRESHOLD_", "131072")
    env.setdefault("MALLOC_TRIM_THRESHOLD_", "131072")
    return env
