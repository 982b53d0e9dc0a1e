"""The decoder's fused graph from ONNX Runtime GenAI's model builder
(``onnxruntime_genai.models.builder``): ``MatMul``/``MatMulNBits``,
``SkipSimplifiedLayerNormalization`` and ``GroupQueryAttention`` with the rotary embedding inside,
~340 nodes where the torch.onnx export has ~4,900 (a batch-1 decode step is dominated by per-op
overhead; docs/performance.md). Its cache is RIGHT-padded (no ``position_ids`` input:
:data:`tritonforge.kv_batch.RIGHT`).

The builder reads a Hugging Face directory (:func:`save_hf_checkpoint`) and runs as a separate
process (its own prints and memory); its output (``model.onnx`` + external data) becomes one
self-contained file with the head dimension of the caches made concrete.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from tritonforge.export.errors import ExportError
from tritonforge.tasks.generation.export.spec import GenAIGraph, WeightOnlyQuantization

# The builder behind a config adapter for transformers 5 (tasks.generation.export.genai_builder).
BUILDER_MODULE = "tritonforge.tasks.generation.export.genai_builder"
# The builder names the caches' last axis symbolically (one export for compressed caches too).
HEAD_AXIS = "kv_cache_dim"


def save_hf_checkpoint(model: Any, tokenizer: Any, out: Path) -> Path:
    """``model`` (a GGUF-loaded, dequantized float32 ``*ForCausalLM``) and ``tokenizer`` as a
    Hugging Face directory at ``out``, written atomically (a sibling ``.tmp`` then rename).

    transformers refuses ``save_pretrained`` of a GGUF-loaded model, so its weights are copied
    into a fresh model of the same config without the GGUF ``quantization_config``."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)  # the caller's model keeps its own
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.dtype = torch.float32
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(model.state_dict())
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    fresh.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def builder_command(
    hf_dir: Path,
    work: Path,
    graph: GenAIGraph,
    int8: WeightOnlyQuantization | None,
) -> list[str]:
    """The builder's command line: fp32, or weight-only ``MatMulNBits`` as ``int8`` declares."""
    options = dict(graph.extra_options)
    if int8 is None:
        precision = "fp32"
    else:
        precision = f"int{int8.bits}"
        options.update(block_size=str(int8.block_size), accuracy_level=str(int8.accuracy_level))
    cmd = [sys.executable, "-m", BUILDER_MODULE, "-i", str(hf_dir), "-o", str(work / "out")]
    cmd += ["-p", precision, "-e", graph.execution_provider, "-c", str(work / "cache")]
    if options:
        cmd += ["--extra_options", *(f"{k}={v}" for k, v in options.items())]
    return cmd


def build_graph(
    hf_dir: Path,
    dst: Path,
    graph: GenAIGraph,
    int8: WeightOnlyQuantization | None,
    work: Path,
    timeout_s: float = 1800,
) -> dict[str, Any]:
    """Build the decoder graph into ``dst`` (one file) using ``work`` as scratch (removed after);
    returns the builder's ``genai_config.json`` model section. :class:`ExportError` with the
    builder's output tail when it fails."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    cmd = builder_command(hf_dir, work, graph, int8)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, env=env, check=False
        )
    except subprocess.TimeoutExpired as e:
        raise ExportError(f"the ONNX Runtime GenAI builder ran past {timeout_s:g} s: {cmd}") from e
    out = work / "out"
    if done.returncode != 0 or not (out / "model.onnx").is_file():
        raise ExportError(
            f"the ONNX Runtime GenAI builder failed (exit {done.returncode}); is "
            f"onnxruntime-genai installed (make setup)? {' '.join(cmd)}\n"
            + (done.stdout + done.stderr)[-2000:]
        )
    config = json.loads((out / "genai_config.json").read_text())["model"]
    single_file(out / "model.onnx", dst, int(config["decoder"]["head_size"]))
    shutil.rmtree(work, ignore_errors=True)
    return config


def single_file(src: Path, dst: Path, head_dim: int) -> None:
    """``src`` (with external data) as one file at ``dst``, the caches' head axis concrete."""
    import onnx

    model = onnx.load(str(src), load_external_data=True)
    for value in (*model.graph.input, *model.graph.output):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == HEAD_AXIS:
                dim.dim_value = head_dim
    onnx.save_model(model, str(dst), save_as_external_data=False)
