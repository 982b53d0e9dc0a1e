"""Find Triton 2.51 inside the ``nvidia-pytriton`` wheel and assemble a backend directory.

The backend directory holds ``python/`` (Triton's Python backend, the stub built for the running
interpreter's version and a ``triton_python_backend_utils.py`` that first puts this venv's
packages on ``sys.path``, since the stub's embedded interpreter ignores ``PYTHONPATH``) plus our
Python-based backends ``onnxruntime/`` and ``pytorch/``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from tritonforge.runtime.errors import ServerNotFoundError

PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent
BACKENDS_SOURCE = Path(__file__).resolve().parent.parent / "backends"
PYTHONPATH_ENV = "TRITONFORGE_PYTHONPATH"
SHIM = f'''# --- tritonforge: make the venv importable inside the stub (it ignores PYTHONPATH).
import os as _tf_os, sys as _tf_sys
_tf_paths = _tf_os.environ.get("{PYTHONPATH_ENV}", "").split(_tf_os.pathsep)
for _tf_p in reversed([p for p in _tf_paths if p]):
    if _tf_p not in _tf_sys.path:
        _tf_sys.path.insert(0, _tf_p)
# --- end tritonforge
'''


@dataclass(frozen=True)
class TritonInstall:
    """Paths of one Triton installation shipped in the nvidia-pytriton wheel."""

    root: Path
    binary: Path
    python_backend: Path
    stub: Path
    libs: Path


def find_triton() -> TritonInstall:
    """Locate tritonserver, the Python backend and the stub for this interpreter's version."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise ServerNotFoundError(
            "nvidia-pytriton is not installed in this interpreter; run `make setup` "
            "(it installs nvidia-pytriton==0.7.0, which ships the Triton 2.51 server)"
        )
    pkg = Path(next(iter(spec.submodule_search_locations)))
    root = pkg / "tritonserver"
    pyver = f"{sys.version_info.major}.{sys.version_info.minor}"
    install = TritonInstall(
        root=root,
        binary=root / "bin" / "tritonserver",
        python_backend=root / "backends" / "python",
        stub=root / "python_backend_stubs" / pyver / "triton_python_backend_stub",
        libs=pkg.parent / "nvidia_pytriton.libs",
    )
    for what, path in [
        ("tritonserver binary", install.binary),
        ("Python backend", install.python_backend / "libtriton_python.so"),
        (f"Python backend stub for Python {pyver}", install.stub),
    ]:
        if not path.exists():
            raise ServerNotFoundError(
                f"{what} not found at {path}; reinstall nvidia-pytriton==0.7.0"
            )
    return install


def venv_paths() -> list[str]:
    """Import paths the models need inside the stub: this venv's site-packages, every other
    site-packages directory on ``sys.path`` (e.g. added by a ``.pth`` file, which the stub does not
    process) and, in a checkout, the project root (where ``tritonforge/`` lives: an editable
    install's import hook is a ``.pth`` too). An installed wheel has ``tritonforge`` in
    site-packages already."""
    paths = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    paths += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    if (PROJECT_ROOT / "tritonforge" / "__init__.py").exists():
        paths.append(str(PROJECT_ROOT))
    return list(dict.fromkeys(paths))


def library_path(install: TritonInstall) -> str:
    """LD_LIBRARY_PATH for tritonserver and the stub: libpython and the wheel's bundled libs."""
    parts = [str(sysconfig.get_config_var("LIBDIR") or ""), str(install.libs)]
    existing = os.environ.get("LD_LIBRARY_PATH", "")
    return os.pathsep.join(p for p in [*parts, existing] if p)


def _copy(src: Path, dst: Path) -> None:
    """Copy unless identical (Triton refuses backend libraries symlinked from elsewhere)."""
    if dst.exists() and not dst.is_symlink():
        st, dt = src.stat(), dst.stat()
        if st.st_size == dt.st_size and st.st_mtime_ns == dt.st_mtime_ns:
            return
    if dst.is_symlink() or dst.exists():
        dst.unlink()
    shutil.copy2(src, dst)


def assemble_backend_dir(install: TritonInstall, target: Path) -> Path:
    """Create (or refresh) ``target`` as a ``--backend-directory``; idempotent."""
    py = target / "python"
    py.mkdir(parents=True, exist_ok=True)
    _copy(install.python_backend / "libtriton_python.so", py / "libtriton_python.so")
    _copy(install.stub, py / "triton_python_backend_stub")
    utils = (install.python_backend / "triton_python_backend_utils.py").read_text()
    (py / "triton_python_backend_utils.py").write_text(SHIM + utils)
    for backend in sorted(p for p in BACKENDS_SOURCE.iterdir() if (p / "model.py").exists()):
        dst = target / backend.name
        dst.mkdir(exist_ok=True)
        _copy(backend / "model.py", dst / "model.py")
    return target
