"""The launcher's units without a server: log parsing, the command line, /proc inspection through
psutil on real processes, the metrics-port probe."""

from __future__ import annotations

import contextlib
import io
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tritonforge.headers import ADMIN_HEADER
from tritonforge.runtime.errors import ServerStartError
from tritonforge.runtime.launcher import procinfo
from tritonforge.runtime.launcher.command import RESTRICTED_APIS, triton_command, triton_environment
from tritonforge.runtime.launcher.locate import PYTHONPATH_ENV, find_triton
from tritonforge.runtime.launcher.logparse import NO_CUDA_NOTE, ServerLog, load_failures, port_hint
from tritonforge.runtime.launcher.metrics import check_port_free
from tritonforge.runtime.launcher.settings import ADMIN_KEY_ENV, ServerSettings

# Lines as tritonserver 2.51 writes them (one per shape load_failures knows).
FAILED_LOG = """\
I1201 10:00:00.000 1 server.cc:674] some info
E1201 10:00:01.000 1 model_lifecycle.cc:654] failed to load 'encoder' version 1: Invalid argument: unexpected inference output 'y'
E1201 10:00:01.000 1 model_repository_manager.cc:703] failed to load model 'tokenizer': at least one version must be available"
E1201 10:00:01.000 1 model_repository_manager.cc:1340] Poll failed for model directory 'broken': failed to open text file
| embed     | 1       | UNAVAILABLE: unmet dependency: encoder |
| ready_one | 1       | READY                                   |
"""


def test_load_failures_reads_every_shape_and_keeps_the_first_reason() -> None:
    failures = load_failures(FAILED_LOG + "failed to load 'encoder' version 1: a later reason\n")
    assert failures == {
        "encoder": "Invalid argument: unexpected inference output 'y'",
        "tokenizer": "at least one version must be available",
        "broken": "failed to open text file",
        "embed": "unmet dependency: encoder",
    }
    assert load_failures("I1201 all models loaded\n| ok | 1 | READY |") == {}


def test_port_hint_only_when_a_port_is_taken() -> None:
    assert "--http-port" in port_hint("E ... Socket 'localhost:8000' already in use")
    assert port_hint("E ... something else") == ""


def test_server_log_is_bounded_and_pumps_raw_lines() -> None:
    log = ServerLog(max_lines=3)
    log.pump(io.BytesIO(b"one\ntwo\n\xff bad utf-8\nfour\n"))
    assert log.text() == "two\n\ufffd bad utf-8\nfour"
    assert log.text(last=1) == "four"
    log.clear()
    assert log.text() == ""


def test_the_cpu_hosts_cuda_stream_errors_are_explained_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue #36 item 3: every ensemble load on a CPU host made Triton log an E-level "unable to
    create stream"; the launcher shows one note instead, and passes everything else through."""
    log = ServerLog(echo=True)
    log.append(
        'E1204 06:43:17.802984 22422 server.cc:241] "CudaDriverHelper has not been initialized."'
    )
    for model in ("embed", "classify", "embed"):
        log.append(
            f'E1204 06:31:02.118 812 ensemble_scheduler.cc:1561] "unable to create stream for '
            f'{model}: CUDA driver version is insufficient for CUDA runtime version"'
        )
        log.append(
            f"I1204 06:31:02.120 812 model_lifecycle.cc:838] \"successfully loaded '{model}'\""
        )
    echoed = capsys.readouterr().err
    assert not [line for line in echoed.splitlines() if line.startswith("E")]
    assert "CUDA driver version" not in log.text()
    assert echoed.count(NO_CUDA_NOTE) == 1 and log.text().count(NO_CUDA_NOTE) == 1
    assert echoed.count("successfully loaded") == 3


def _settings(tmp_path: Path, **kwargs: object) -> ServerSettings:
    return ServerSettings(
        tmp_path, host="127.0.0.1", http_port=1, grpc_port=2, metrics_port=3, **kwargs
    )  # type: ignore[arg-type]


def _flags(cmd: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for arg in cmd[1:]:
        name, _, value = arg.partition("=")
        out.setdefault(name, []).append(value)
    return out


def test_command_behind_the_front_listens_on_sockets_and_leaves_the_key_to_the_front(
    tmp_path: Path,
) -> None:
    s = _settings(tmp_path, admin_key="k3y")
    cmd = triton_command(s, Path("/bin/tritonserver"), tmp_path / "b", tmp_path / "sock", "pfx_")
    flags = _flags(cmd)
    assert cmd[0] == "/bin/tritonserver"
    assert flags["--http-address"] == [f"unix:{tmp_path / 'sock' / 'http.sock'}"]
    assert flags["--grpc-address"][0].startswith(f"unix:{tmp_path / 'sock'}/")
    assert not any("k3y" in a for a in cmd)
    assert flags["--metrics-port"] == ["3"]
    assert "python,shm-region-prefix-name=pfx_" in flags["--backend-config"]
    assert "--load-model" not in flags  # mode none: the whole repository


def test_command_without_the_front_binds_tcp_and_restricts_the_apis(tmp_path: Path) -> None:
    s = _settings(tmp_path, front=False, admin_key="k3y", model_control_mode="explicit")
    flags = _flags(triton_command(s, Path("tritonserver"), tmp_path, tmp_path, "p_"))
    assert flags["--http-port"] == ["1"] and flags["--grpc-port"] == ["2"]
    want = f"{','.join(RESTRICTED_APIS)}:{ADMIN_HEADER}=k3y"
    assert flags["--http-restricted-api"] == [want]
    assert flags["--grpc-restricted-protocol"] == [want]
    assert flags["--load-model"] == ["*"]  # explicit control starts with everything loaded
    named = _settings(tmp_path, model_control_mode="explicit", load_models=["a", "b"])
    assert _flags(triton_command(named, Path("t"), tmp_path, tmp_path, "p_"))["--load-model"] == [
        "a",
        "b",
    ]


def test_environment_drops_the_admin_key_and_keeps_user_settings() -> None:
    env = triton_environment(find_triton(), {ADMIN_KEY_ENV: "secret", "OMP_NUM_THREADS": "4"})
    assert ADMIN_KEY_ENV not in env
    assert env["OMP_NUM_THREADS"] == "4"
    assert env[PYTHONPATH_ENV] and env["LD_LIBRARY_PATH"]


@pytest.fixture
def fake_stub(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A shell whose argv is a 2.51 stub's; it runs a child, so its group has two members."""
    script = tmp_path / "repo" / "tokenizer" / "1" / "model.py"
    script.parent.mkdir(parents=True)
    script.write_text("sleep 30\n")
    argv = [
        str(tmp_path / "triton_python_backend_stub"), str(script), "region", "1", "2",
        str(os.getpid()), "/lib", "ipc", "tokenizer_0_0", "/backend",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, executable="/bin/sh", start_new_session=True)
    deadline = time.monotonic() + 30  # a loaded machine starts the child late

    def child_runs_sleep() -> bool:
        # until it execs, a forked child still shows the stub's argv (seen under load: two
        # "stubs" in the group, the child's PID reported)
        children = [p for p in procinfo.group_members(proc.pid) if p != proc.pid]
        with contextlib.suppress(psutil.Error):
            return bool(children) and psutil.Process(children[0]).cmdline()[:1] == ["sleep"]
        return False

    while not child_runs_sleep() and time.monotonic() < deadline:
        time.sleep(0.05)
    yield proc
    with contextlib.suppress(ProcessLookupError):  # the group may be gone already
        os.killpg(proc.pid, 9)
    proc.wait()


def test_group_members_and_stubs_come_from_the_live_process_group(
    fake_stub: subprocess.Popen[bytes],
) -> None:
    members = procinfo.group_members(fake_stub.pid)
    assert fake_stub.pid in members and len(members) == 2
    assert procinfo.python_stubs(members) == {"tokenizer_0_0": (fake_stub.pid, "tokenizer")}
    os.killpg(fake_stub.pid, 9)
    fake_stub.wait()  # reaped; the orphaned sleep goes too
    deadline = time.monotonic() + 10
    while procinfo.group_members(fake_stub.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert procinfo.group_members(fake_stub.pid) == []


def test_shm_regions_by_prefix_and_directory(tmp_path: Path) -> None:
    for name in ("pfx_a", "pfx_b", "other"):
        (tmp_path / name).write_bytes(b"")
    assert procinfo.shm_regions(tmp_path, "pfx_") == [tmp_path / "pfx_a", tmp_path / "pfx_b"]
    assert procinfo.shm_regions(tmp_path / "gone", "pfx_") == []
    assert procinfo.shm_dir(123, namespaced=True) == Path("/proc/123/root/dev/shm")
    assert procinfo.shm_dir(123, namespaced=False) == procinfo.SHM_DIR


def test_a_taken_metrics_port_names_the_flag() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ServerStartError, match="--metrics-port"):
            check_port_free("127.0.0.1", port)
    check_port_free("127.0.0.1", port)  # free again
