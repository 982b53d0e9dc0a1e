"""NVIDIA perf_analyzer as a second opinion for ``make bench`` (optional).

perf_analyzer is not on PyPI by itself; the ``tritonclient==2.51.0`` wheel (matching the embedded
server) ships the binary. ``python -m tritonforge.loadtest.perf_analyzer.tool install`` downloads that wheel with pip
(no dependencies, nothing installed into the venv), extracts ``perf_analyzer`` into
``<venv>/tools/perf_analyzer/`` and links the two shared libraries it needs (``libb64.so.0d``,
``libcudart.so.12``) to the copies bundled in the ``nvidia-pytriton`` wheel. No GPU is used.
``python -m tritonforge.loadtest.bench --perf-analyzer`` then measures each Triton target with it too.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tritonforge.loadtest.errors import LoadtestError

WHEEL = "tritonclient==2.51.0"
TOOL_DIR = Path(
    os.environ.get("TRITONFORGE_PERF_ANALYZER_DIR", Path(sys.prefix) / "tools/perf_analyzer")
)
_LIBS = {"libb64.so.0d": "libb64-*.so.0d", "libcudart.so.12": "libcudart-*.so.12*"}


class PerfAnalyzerError(LoadtestError):
    """perf_analyzer is missing or failed; the message says how to get it or what it printed."""


def binary() -> Path | None:
    path = TOOL_DIR / "perf_analyzer"
    return path if path.exists() else None


def _pytriton_libs() -> Path:
    import pytriton

    libs = Path(pytriton.__file__).resolve().parent.parent / "nvidia_pytriton.libs"
    if not libs.is_dir():
        raise PerfAnalyzerError(f"{libs} not found (is nvidia-pytriton installed?)")
    return libs


def install() -> Path:
    """Download the wheel, extract the binary, link its libraries; returns the binary's path."""
    TOOL_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", WHEEL, "--no-deps", "-d", tmp],
            check=True,
        )
        (wheel,) = Path(tmp).glob("tritonclient-*.whl")
        with zipfile.ZipFile(wheel) as z:
            member = next(n for n in z.namelist() if n.endswith("/bin/perf_analyzer"))
            (TOOL_DIR / "perf_analyzer").write_bytes(z.read(member))
    (TOOL_DIR / "perf_analyzer").chmod(0o755)
    lib_dir = TOOL_DIR / "lib"
    lib_dir.mkdir(exist_ok=True)
    libs = _pytriton_libs()
    for name, pattern in _LIBS.items():
        found = sorted(libs.glob(pattern))
        if not found:
            raise PerfAnalyzerError(f"no {pattern} in {libs}")
        source = found[0]
        link = lib_dir / name
        link.unlink(missing_ok=True)
        link.symlink_to(source)
    return TOOL_DIR / "perf_analyzer"


def measure(
    *,
    model: str,
    url: str,
    protocol: str,
    concurrency: int,
    texts: Sequence[str],
    window_ms: int,
    workdir: Path,
    parameters: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float | None = None,
    input_name: str = "text",
) -> dict[str, Any]:
    """perf_analyzer's throughput (infer/s), p50/p95/p99 (ms) and server-side breakdown (queue,
    compute per composing model) at one concurrency. Stability checks are off (the machine is
    shared and noisy): perf_analyzer stops after 3 windows (at most 6) and reports the last.

    ``headers`` unlock restricted APIs (perf_analyzer reads the model config); over gRPC Triton
    expects them as ``triton-grpc-protocol-<name>`` metadata.
    """
    exe = binary()
    if exe is None:
        raise PerfAnalyzerError(
            "perf_analyzer is not installed: python -m tritonforge.loadtest.perf_analyzer.tool install"
        )
    data = workdir / "pa_input.json"
    data.write_text(json.dumps({"data": [{input_name: [t]} for t in texts[:256]]}))
    out = workdir / f"pa_{model}_{protocol}_{concurrency}.csv"
    command = [
        str(exe), "-m", model, "-u", url, "-i", protocol, "-b", "1",
        "--concurrency-range", str(concurrency), "--input-data", str(data),
        "--measurement-interval", str(window_ms), "--stability-percentage", "999",
        "--max-trials", "6", "--percentile", "95", "-f", str(out),
    ]  # fmt: skip
    for key, value in (parameters or {}).items():
        command += ["--request-parameter", f"{key}:{value}:string"]
    for key, value in (headers or {}).items():
        name = f"triton-grpc-protocol-{key}" if protocol == "grpc" else key
        command += ["-H", f"{name}:{value}"]
    env = {**os.environ, "LD_LIBRARY_PATH": str(TOOL_DIR / "lib")}
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, check=False, timeout=timeout_s
        )
    except subprocess.TimeoutExpired as e:
        raise PerfAnalyzerError(f"perf_analyzer stalled: killed after {timeout_s:.0f} s") from e
    if done.returncode != 0 or not out.exists():
        raise PerfAnalyzerError(
            f"perf_analyzer failed ({done.returncode}): {done.stdout[-1500:]}{done.stderr[-1500:]}"
        )
    with out.open() as f:
        row = next(csv.DictReader(f))
    server = done.stdout[done.stdout.find("Server:") :].split("Inferences/Second vs.")[0]
    return {
        "server_breakdown": server.strip(),
        "infer_per_s": float(row["Inferences/Second"]),
        "p50_ms": float(row["p50 latency"]) / 1000.0,
        "p95_ms": float(row["p95 latency"]) / 1000.0,
        "p99_ms": float(row["p99 latency"]) / 1000.0,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["install"]:
        print(f"perf_analyzer installed at {install()}")
        return 0
    if args == ["path"]:
        path = binary()
        print(
            path
            if path
            else "not installed (python -m tritonforge.loadtest.perf_analyzer.tool install)"
        )
        return 0 if path else 1
    print("usage: python -m tritonforge.loadtest.perf_analyzer.tool install|path", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
