"""How fast ONNX Runtime builds a session for a served ONNX graph, and which ways of storing or
loading it give the same outputs faster (issue #19: a killed stub's reload is mostly this).

``python -m tritonforge.loadtest.reliability.ort_load model_repository/generate/1/decoder.onnx
[--rounds 3] [--work DIR]`` writes the variants it needs under ``--work`` (default: a temporary
directory, removed afterwards), then times session creation of each, interleaved, every one in a
fresh process (as a reloaded stub), and checks that every variant's outputs are bit-identical to
the original's on one input (a decoder: 8 prompt tokens; an encoder: one 16-token row).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

# name -> (file, session config entries, graph optimisation level)
Variant = tuple[str, dict[str, str], str]


def _options(ort: Any, entries: dict[str, str], level: str, threads: int) -> Any:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    for key, value in entries.items():
        if key == "session.optimized_model_filepath":  # an attribute, not a config entry
            options.optimized_model_filepath = value
        else:
            options.add_session_config_entry(key, value)
    return options


def prepare(source: Path, work: Path, threads: int) -> dict[str, Variant]:
    """Write the pre-optimised variants of ``source`` into ``work``; name -> how to load it."""
    import onnxruntime as ort

    all_ = "ORT_ENABLE_ALL"
    variants: dict[str, Variant] = {
        "original (ENABLE_ALL)": (str(source), {}, all_),
    }
    optimized = work / "optimized.onnx"
    ort.InferenceSession(
        str(source),
        _options(
            ort,
            {
                "session.optimized_model_filepath": str(optimized),
                "session.optimized_model_external_initializers_file_name": "optimized.onnx.data",
                "session.optimized_model_external_initializers_min_size_in_bytes": "1024",
            },
            all_,
            threads,
        ),
        providers=["CPUExecutionProvider"],
    )
    variants["optimized + external data, DISABLE_ALL"] = (str(optimized), {}, "ORT_DISABLE_ALL")
    variants["optimized + external data, ENABLE_ALL"] = (str(optimized), {}, all_)
    prepacked = work / "prepacked.onnx"
    ort.InferenceSession(
        str(source),
        _options(
            ort,
            {
                "session.optimized_model_filepath": str(prepacked),
                "session.optimized_model_external_initializers_file_name": "prepacked.onnx.data",
                "session.optimized_model_external_initializers_min_size_in_bytes": "1024",
                "session.save_external_prepacked_constant_initializers": "1",
            },
            all_,
            threads,
        ),
        providers=["CPUExecutionProvider"],
    )
    variants["optimized + prepacked external data, DISABLE_ALL"] = (
        str(prepacked),
        {},
        "ORT_DISABLE_ALL",
    )
    ort_format = work / "model.ort"
    try:
        ort.InferenceSession(
            str(source),
            _options(
                ort,
                {
                    "session.optimized_model_filepath": str(ort_format),
                    "session.save_model_format": "ORT",
                },
                "ORT_ENABLE_EXTENDED",
                threads,
            ),
            providers=["CPUExecutionProvider"],
        )
        variants["ORT format (EXTENDED)"] = (
            str(ort_format),
            {"session.load_model_format": "ORT"},
            "ORT_DISABLE_ALL",
        )
        variants["ORT format, bytes used directly"] = (
            str(ort_format),
            {
                "session.load_model_format": "ORT",
                "session.use_ort_model_bytes_directly": "1",
                "session.use_ort_model_bytes_for_initializers": "1",
            },
            "ORT_DISABLE_ALL",
        )
    except Exception as e:  # record why, keep the others
        print(f"ORT format: {type(e).__name__}: {e}"[:300], file=sys.stderr)
    return variants


def sample_feed(session: Any) -> dict[str, np.ndarray]:
    """One input: a decoder gets 8 prompt tokens and an empty past, an encoder one 16-token row."""
    feed: dict[str, np.ndarray] = {}
    # a decoder has caches (a right-padded one has no position_ids)
    n = 8 if any(x.name.startswith("past_key_values.") for x in session.get_inputs()) else 16
    for i in session.get_inputs():
        if i.name.startswith("past_key_values."):
            heads, dim = int(i.shape[1]), int(i.shape[3])
            feed[i.name] = np.zeros((1, heads, 0, dim), np.float32)
        elif i.name == "position_ids":
            feed[i.name] = np.arange(8, dtype=np.int64)[None]
        elif i.name == "attention_mask":
            feed[i.name] = np.ones((1, n), np.int64)
        else:
            feed[i.name] = (np.arange(n, dtype=np.int64)[None] * 37 + 11) % 1000
    return feed


def load_once(variant: Variant, threads: int) -> dict[str, Any]:
    """Create the session (timed) and run the sample once (timed); the outputs' digest."""
    import hashlib

    import onnxruntime as ort

    path, entries, level = variant
    started = time.perf_counter()
    options = _options(ort, entries, level, threads)
    if entries.get("session.use_ort_model_bytes_directly") == "1":
        # the buffer must outlive the session: ORT then reads the weights in place
        load_once.buffer = Path(path).read_bytes()  # type: ignore[attr-defined]
        session = ort.InferenceSession(
            load_once.buffer,  # type: ignore[attr-defined]
            options,
            providers=["CPUExecutionProvider"],
        )
    else:
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    created = time.perf_counter() - started
    feed = sample_feed(session)
    started = time.perf_counter()
    outputs = session.run(None, feed)
    first_run = time.perf_counter() - started
    started = time.perf_counter()
    session.run(None, feed)
    second_run = time.perf_counter() - started
    digest = hashlib.sha256(
        b"".join(np.ascontiguousarray(o).tobytes() for o in outputs)
    ).hexdigest()
    return {
        "session_s": round(created, 3),
        "first_run_s": round(first_run, 3),
        "second_run_s": round(second_run, 3),
        "outputs_sha256": digest[:16],
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tritonforge.loadtest.reliability.ort_load", description=__doc__
    )
    p.add_argument("model", type=Path)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--work", type=Path)
    p.add_argument("--only", default="", help="comma-separated substrings of variant names")
    p.add_argument("--load-once", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.load_once:
        print(json.dumps(load_once(tuple(json.loads(args.load_once)), args.threads)))
        return 0
    work = args.work or Path(tempfile.mkdtemp(prefix="tritonforge-ort-load-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        started = time.perf_counter()
        variants = prepare(args.model.resolve(), work, args.threads)
        print(
            f"prepared {len(variants)} variants in {time.perf_counter() - started:.1f} s",
            flush=True,
        )
        wanted = [w for w in args.only.split(",") if w]
        if wanted:
            variants = {k: v for k, v in variants.items() if any(w in k for w in wanted)}
        rows: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, variant in variants.items():  # interleaved: the machine's noise hits all
                load = os.getloadavg()[0]
                out = subprocess.run(
                    [sys.executable, "-m", "tritonforge.loadtest.reliability.ort_load", str(args.model),
                     "--threads", str(args.threads), "--load-once", json.dumps(variant)],
                    capture_output=True, text=True, check=False,
                )  # fmt: skip
                if out.returncode:
                    print(f"{name}: failed: {out.stderr[-300:]}", flush=True)
                    continue
                row = json.loads(out.stdout.strip().splitlines()[-1]) | {"load": round(load, 1)}
                rows[name].append(row)
                print(f"{name}: {row}", flush=True)
        print("\nmedian session_s / first_run_s, outputs (load average at each run)")
        for name, runs in rows.items():
            if runs:
                print(
                    f"{name:52s} {statistics.median(r['session_s'] for r in runs):7.3f} "
                    f"{statistics.median(r['first_run_s'] for r in runs):7.3f} "
                    f"{sorted({r['outputs_sha256'] for r in runs})} "
                    f"loads {[r['load'] for r in runs]}"
                )
        for f in sorted(work.iterdir()):
            print(f"  {f.name}: {f.stat().st_size / 1e6:.1f} MB")
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
