"""perf_analyzer (and Model Analyzer) ready to point: input-data files for every public model of the
repository, from the load-test corpus, and the perf_analyzer command line with the admin header.

``python -m tritonforge.loadtest.perf_analyzer.inputs`` (``make perf``) writes ``<out-dir>/<model>.json`` for every
public model (discovered from the configs: new pipelines are covered without a change here) and
runs perf_analyzer against a running server (``--url``, gRPC ``host:port``), passing the admin key
(``$TRITONFORGE_ADMIN_KEY``) that the restricted model-config/statistics APIs need. Decoupled
models are measured with ``--streaming``. ``--write-only`` only writes the files and prints each
command, for NVIDIA's SDK container on a GPU host (docs/performance.md).

The file format is perf_analyzer's ``--input-data`` JSON: ``{"data": [{<input>: <values>}]}``
with one entry per request; a dynamic (-1) non-batch dimension gets ``content`` + ``shape``. A
BYTES input gets corpus texts, unless the model's task gives its own items (``perf_items()`` in
its ``loadtest`` module: the image task's photos), sent as ``{"b64": ...}`` (Triton's BYTES
serialization: each item's 4-byte length, then its bytes), each item once.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import shlex
import struct
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tritonforge import tasks
from tritonforge.env import env_str
from tritonforge.headers import ADMIN_HEADER, GRPC_ADMIN_HEADER
from tritonforge.loadtest import corpus
from tritonforge.loadtest.errors import LoadtestError
from tritonforge.loadtest.perf_analyzer.tool import TOOL_DIR, binary
from tritonforge.logs import run_main
from tritonforge.modelconfig import ModelConfig
from tritonforge.pipelines import TASK_KEY
from tritonforge.repository import load_model_config
from tritonforge.runtime.supervisor.model_graph import public_models

DEFAULT_ROWS = 256
log = logging.getLogger(__name__)
ADMIN_KEY_ENV = "TRITONFORGE_ADMIN_KEY"


class PerfInputError(LoadtestError):
    """An input cannot be generated, perf_analyzer is missing, or no server answers."""


def is_decoupled(config: ModelConfig) -> bool:
    return bool((config.raw.get("model_transaction_policy") or {}).get("decoupled", False))


def task_items(config: ModelConfig) -> list[bytes] | None:
    """The encoded items the model's task sends as BYTES (its ``loadtest`` module's
    ``perf_items()``: an image task's photos), or None: corpus texts."""
    task = config.parameters.get(TASK_KEY)
    if task not in tasks.registry() or not (tasks.get(task).folder / "loadtest").is_dir():
        return None
    items = getattr(tasks.get(task).module("loadtest"), "perf_items", None)
    return list(items()) if items is not None else None


def _b64_bytes(items: Sequence[bytes]) -> dict[str, str]:
    """perf_analyzer's binary form of a BYTES tensor: base64 of Triton's serialization (each
    element's 4-byte little-endian length, then its bytes)."""
    raw = b"".join(struct.pack("<I", len(item)) + item for item in items)
    return {"b64": base64.b64encode(raw).decode("ascii")}


def _values(
    dtype: Any, texts: Sequence[str], count: int, index: int, items: Sequence[bytes] | None = None
) -> Any:
    """``count`` values of one request: the task's items (base64) or corpus texts for BYTES,
    ones for numbers."""
    if np.dtype(dtype).kind == "O" and items:
        return _b64_bytes([items[(index + k) % len(items)] for k in range(count)])
    if np.dtype(dtype).kind == "O":
        return [texts[(index + k) % len(texts)] for k in range(count)]
    if np.dtype(dtype).kind == "b":
        return [True] * count
    return [1] * count


def input_data(
    config: ModelConfig, texts: Sequence[str], rows: int = DEFAULT_ROWS
) -> dict[str, Any]:
    """perf_analyzer ``--input-data`` for ``config``: ``rows`` requests of batch 1 (perf_analyzer's
    ``-b`` repeats them), every required input filled, dynamic dims sized 1."""
    if not texts:
        raise PerfInputError("no texts to build the input data from")
    items = task_items(config)
    data = []
    for i in range(min(rows, len(items)) if items else rows):  # each item once: they are large
        entry: dict[str, Any] = {}
        for spec in config.inputs:
            if spec.optional:
                continue
            shape = [1 if d < 0 else d for d in spec.dims]
            count = int(np.prod(shape)) if shape else 1
            values = _values(spec.numpy_dtype, texts, count, i, items)
            dynamic = any(d < 0 for d in spec.dims)
            entry[spec.name] = {"content": values, "shape": shape} if dynamic else values
        data.append(entry)
    return {"data": data}


@dataclass(frozen=True)
class Target:
    """One public model and its input-data file."""

    model: str
    path: Path
    decoupled: bool


def write_inputs(
    repository: Path,
    out_dir: Path,
    texts: Sequence[str],
    models: Sequence[str] = (),
    rows: int = DEFAULT_ROWS,
) -> list[Target]:
    """Write ``<out_dir>/<model>.json`` for ``models`` (default: every public model)."""
    names = list(models) or public_models(repository)
    if not names:
        raise PerfInputError(f"no public models in {repository}")
    out_dir.mkdir(parents=True, exist_ok=True)
    targets = []
    for name in names:
        config = load_model_config(repository, name)
        path = out_dir / f"{name}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(input_data(config, texts, rows)))
        tmp.replace(path)
        targets.append(Target(model=name, path=path, decoupled=is_decoupled(config)))
    return targets


def perf_command(
    exe: str,
    target: Target,
    url: str,
    admin_key: str | None,
    concurrency_range: str = "1:4",
    measurement_interval_ms: int = 3000,
    extra: Sequence[str] = (),
) -> list[str]:
    """The perf_analyzer command line for ``target`` over gRPC (streaming when decoupled)."""
    command = [
        exe, "-m", target.model, "-u", url, "-i", "grpc",
        "--input-data", str(target.path),
        "--concurrency-range", concurrency_range,
        "--measurement-interval", str(measurement_interval_ms),
    ]  # fmt: skip
    if target.decoupled:
        command.append("--streaming")
    if admin_key:
        # Triton reads gRPC restricted-API keys as metadata prefixed triton-grpc-protocol-.
        command += ["-H", f"{GRPC_ADMIN_HEADER}:{admin_key}"]
    return [*command, *extra]


def _display(command: Sequence[str], admin_key: str | None) -> str:
    text = shlex.join(command)
    return text.replace(admin_key, f"${ADMIN_KEY_ENV}") if admin_key else text


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tritonforge.loadtest.perf_analyzer.inputs", description=__doc__
    )
    p.add_argument("models", nargs="*", help="models to measure (default: every public model)")
    p.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    p.add_argument("--out-dir", type=Path, default=Path("reports/perf"))
    p.add_argument(
        "--url",
        default=env_str("TRITONFORGE_GRPC_URL", "localhost:8001"),
        help="gRPC host:port of a running server (default $TRITONFORGE_GRPC_URL or localhost:8001)",
    )
    p.add_argument("--rows", type=int, default=DEFAULT_ROWS, help="requests in each input file")
    p.add_argument("--concurrency-range", default="1:4")
    p.add_argument("--measurement-interval-ms", type=int, default=3000)
    p.add_argument("--write-only", action="store_true", help="write the files, print commands")
    args, extra = p.parse_known_args(argv)
    admin_key = env_str(ADMIN_KEY_ENV)
    texts = corpus.generate(size=max(args.rows, 1))
    try:
        targets = write_inputs(args.model_repository, args.out_dir, texts, args.models, args.rows)
        exe = binary()
        if exe is None and not args.write_only:
            raise PerfInputError(
                "perf_analyzer is not installed: python -m tritonforge.loadtest.perf_analyzer.tool install "
                "(or use --write-only and NVIDIA's SDK container, docs/performance.md)"
            )
        failed = []
        for target in targets:
            command = perf_command(
                str(exe or "perf_analyzer"), target, args.url, admin_key,
                args.concurrency_range, args.measurement_interval_ms, extra,
            )  # fmt: skip
            line = f"==> [perf] {target.model}: {_display(command, admin_key)}"
            if args.write_only:
                print(line, flush=True)  # the commands are what --write-only prints
                continue
            log.info("%s", line)
            env = {**os.environ, "LD_LIBRARY_PATH": str(TOOL_DIR / "lib")}
            if subprocess.call(command, env=env) != 0:
                failed.append(target.model)
    except PerfInputError as e:
        log.error("%s", e)
        return 2
    if not admin_key:
        log.warning(
            f"${ADMIN_KEY_ENV} is unset: perf_analyzer reads the model config, which a "
            f"restricted server refuses without the '{ADMIN_HEADER}' key"
        )
    if failed:
        log.error("perf_analyzer failed for %s", ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
