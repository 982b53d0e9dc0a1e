"""ONNX Runtime sessions from a remembered optimised graph: a (re)load skips graph optimisation.

Building the session of the 650 MB fp32 decoder took 6.4 s at load 11 (most of a ``generate``
reload after a crash); the same graph already optimised and saved with its weights as external
data took 2.2-2.4 s and gives bit-identical outputs (docs/reliability.md, `ort_load`). So the
first load saves what ONNX Runtime optimised into the per-user cache
(:func:`tritonforge.integrity.default_cache_dir` ``/ort``, 0700, never the model repository,
which may be read-only), and later loads of the same artifact read it with optimisation off.

Contract: the saved graph is keyed by the source artifact's sha256 (verified by the caller),
the ONNX Runtime version, the CPU's flags and every session setting that shapes the graph; it is
written into a fresh directory renamed into place whole (atomic), with sha256 sidecars that every
load verifies (:func:`tritonforge.integrity.verify_sidecar`, remembered per file version). Any
problem (no cache, a failed save, a bad sidecar) means a plain session from the artifact.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tritonforge.errors import ArtifactIntegrityError
from tritonforge.host import cpu_flags
from tritonforge.integrity import default_cache_dir, private_dir, verify_sidecar, write_sidecar

GRAPH = "model.onnx"
WEIGHTS = "model.onnx.data"


def _cpu_flags() -> str:
    flags = " ".join(sorted(cpu_flags()))
    return hashlib.sha256(flags.encode()).hexdigest()[:12] if flags else "unknown"


def graph_key(digest: str, ort_version: str, level: int, entries: Mapping[str, str]) -> str:
    """Name of the saved graph of an artifact with ``digest`` under these settings."""
    settings = {"digest": digest, "ort": ort_version, "cpu": _cpu_flags(), "level": level}
    blob = json.dumps({**settings, "entries": dict(sorted(entries.items()))}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def session(
    ort: Any,
    path: Path,
    digest: str | None,
    options: Any,
    entries: Mapping[str, str],
    cache_root: Path | None = None,
) -> Any:
    """An ``InferenceSession`` of ``path`` (CPU) with ``options``: from the remembered optimised
    graph when there is one, else from ``path``, saving the optimised graph for the next load.
    ``digest``: ``path``'s verified sha256 (None: no cache); ``entries``: the session config
    entries set on ``options``."""
    providers = ["CPUExecutionProvider"]
    root = cache_root or default_cache_dir()
    if digest is None or root is None or not private_dir(root / "ort"):
        return ort.InferenceSession(str(path), options, providers=providers)
    chosen = options.graph_optimization_level
    level = int(chosen)
    saved = root / "ort" / graph_key(digest, ort.__version__, level, entries)
    if (saved / GRAPH).is_file():
        try:
            for name in (GRAPH, WEIGHTS):
                verify_sidecar(saved / name, required=True, cache_dir=root)
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            return ort.InferenceSession(str(saved / GRAPH), options, providers=providers)
        except (ArtifactIntegrityError, OSError):
            shutil.rmtree(saved, ignore_errors=True)  # made again below
            options.graph_optimization_level = chosen
    staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root / "ort"))
    try:
        options.optimized_model_filepath = str(staging / GRAPH)
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", WEIGHTS
        )
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes", "1024"
        )
        made = ort.InferenceSession(str(path), options, providers=providers)
        if (staging / GRAPH).is_file() and (staging / WEIGHTS).is_file():
            for name in (GRAPH, WEIGHTS):
                write_sidecar(staging / name)
            with contextlib.suppress(OSError):  # another stub saved it first: keep theirs
                staging.rename(saved)
        return made
    finally:
        shutil.rmtree(staging, ignore_errors=True)
