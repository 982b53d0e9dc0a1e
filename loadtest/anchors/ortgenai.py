"""ONNX Runtime GenAI in-process: the single-stream ceiling of the generation bench.

Bench-only (the ``bench`` extra: ``onnxruntime-genai``). The model is built once into
``build/ortgenai/<precision>`` by its model builder from the same dequantized SmolLM2 checkpoint
the llama.cpp GGUFs come from (:func:`tritonforge.loadtest.anchors.llamacpp.save_checkpoint`), with
``intra_op_num_threads`` set (it uses one thread otherwise).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tritonforge.loadtest.errors import LoadtestError

log = logging.getLogger(__name__)

# precision -> builder flags (int4: blocks of 32, int8 compute: accuracy level 4)
PRECISIONS: dict[str, tuple[str, ...]] = {
    "fp32": ("-p", "fp32"),
    "int4": ("-p", "int4", "--extra_options", "int4_block_size=32", "int4_accuracy_level=4"),
}


class OrtGenAIError(LoadtestError):
    """ONNX Runtime GenAI is missing or its model could not be built."""


def available() -> bool:
    import importlib.util

    return importlib.util.find_spec("onnxruntime_genai") is not None


def model_dir(build_dir: Path, precision: str) -> Path:
    return build_dir / "ortgenai" / precision


def build(checkpoint: Path, build_dir: Path, precision: str, threads: int = 2) -> Path:
    """The GenAI model for ``precision`` (skipped when present); ``threads`` intra-op threads."""
    out = model_dir(build_dir, precision)
    config = out / "genai_config.json"
    if not config.is_file():
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint)]
        cmd += ["-o", str(tmp), "-e", "cpu", "-c", str(build_dir / "ortgenai" / "cache")]
        cmd += list(PRECISIONS[precision])
        log.info("    $ %s", " ".join(cmd))
        try:
            subprocess.run(cmd, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        except (OSError, subprocess.CalledProcessError) as e:
            raise OrtGenAIError(f"onnxruntime_genai model builder ({precision}) failed: {e}") from e
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    set_threads(config, threads)
    return out


def set_threads(config: Path, threads: int) -> None:
    """``model.decoder.session_options.intra_op_num_threads`` in ``genai_config.json``."""
    data = json.loads(config.read_text())
    options = data["model"]["decoder"].setdefault("session_options", {})
    if options.get("intra_op_num_threads") != threads:
        options["intra_op_num_threads"] = threads
        options["inter_op_num_threads"] = 1
        config.write_text(json.dumps(data, indent=4) + "\n")


class GenAIModel:
    """Greedy generation and teacher-forced logits over a GenAI model directory."""

    def __init__(self, path: Path) -> None:
        import onnxruntime_genai as og

        self.og = og
        self.model = og.Model(str(path))

    def _generator(self, ids: Sequence[int], max_new: int, min_new: int) -> Any:
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(
            do_sample=False,
            max_length=len(ids) + max_new,
            min_length=len(ids) + min_new,
            batch_size=1,
        )
        gen = self.og.Generator(self.model, params)
        gen.append_tokens(np.asarray([list(ids)], np.int32))
        return gen

    def stream_ids(self, ids: Sequence[int], max_new: int) -> Iterator[int]:
        """Exactly ``max_new`` greedy tokens after ``ids`` (EOS suppressed by ``min_length``),
        one at a time; the first comes from the prefill."""
        gen = self._generator(ids, max_new, max_new)
        for _ in range(max_new):
            if gen.is_done():
                return
            gen.generate_next_token()
            yield int(gen.get_next_tokens()[0])

    def perplexity(self, rows: Sequence[list[int]]) -> float:
        """exp(mean next-token NLL) over ``rows``, each scored alone (as the export's gate)."""
        nll, count = 0.0, 0
        for ids in rows:
            gen = self._generator(ids, 1, 0)
            logits = np.asarray(gen.get_output("logits"), np.float64)[0, :-1]
            lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
            nll += float((lse - logits[np.arange(len(ids) - 1), ids[1:]]).sum())
            count += len(ids) - 1
        return float(np.exp(nll / count))
