"""``model_repository/*/configs/gpu.pbtxt`` against ``config.pbtxt`` and the ONNX graph."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tritonforge.deploy.validate.paths import MODEL_REPOSITORY

# onnxruntime backend accelerators (Triton onnxruntime_backend README) and TensorRT precisions.
GPU_ACCELERATORS = {"tensorrt", "cuda"}
TRT_PRECISIONS = {"FP32", "FP16", "INT8"}


def _tensors(config: Mapping[str, Any], key: str) -> list[tuple[str, str, tuple[int, ...]]]:
    return sorted(
        (str(t["name"]), str(t.get("data_type")), tuple(t.get("dims", [])))
        for t in config.get(key, [])
    )


_ONNX_TYPES = {1: "TYPE_FP32", 7: "TYPE_INT64", 6: "TYPE_INT32", 10: "TYPE_FP16", 9: "TYPE_BOOL"}


def onnx_signature(model: Path) -> dict[str, str]:
    """``{tensor name: TYPE_*}`` of an ONNX graph's inputs and outputs (weights not loaded)."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    return {
        v.name: _ONNX_TYPES.get(v.type.tensor_type.elem_type, str(v.type.tensor_type.elem_type))
        for v in [*graph.input, *graph.output]
    }


def gpu_config_findings(model_dir: Path) -> list[str]:
    """``configs/gpu.pbtxt`` of one model: parses, same interface as ``config.pbtxt``, KIND_GPU."""
    from tritonforge.errors import ModelConfigError
    from tritonforge.modelconfig import pbtxt_to_dict

    name = model_dir.name
    try:
        base = pbtxt_to_dict((model_dir / "config.pbtxt").read_text())
        gpu = pbtxt_to_dict((model_dir / "configs" / "gpu.pbtxt").read_text())
    except (OSError, ModelConfigError) as e:
        return [f"{name}: {e}"]
    out: list[str] = []
    if gpu.get("name", name) != name:
        out.append(f"{name}: gpu.pbtxt names the model {gpu.get('name')!r}")
    for key in ("backend", "platform", "max_batch_size", "default_model_filename"):
        if base.get(key) != gpu.get(key):
            out.append(
                f"{name}: {key} differs: config.pbtxt {base.get(key)!r}, gpu.pbtxt {gpu.get(key)!r}"
            )
    for key in ("input", "output"):
        if _tensors(base, key) != _tensors(gpu, key):
            out.append(f"{name}: {key}s differ between config.pbtxt and gpu.pbtxt")
    groups = gpu.get("instance_group") or []
    if not groups or any(g.get("kind") != "KIND_GPU" for g in groups):
        out.append(f"{name}: every instance_group of gpu.pbtxt must be KIND_GPU")
    accelerators = ((gpu.get("optimization") or {}).get("execution_accelerators") or {}).get(
        "gpu_execution_accelerator"
    ) or []
    for acc in accelerators:
        params = acc.get("parameters") or {}
        if acc.get("name") not in GPU_ACCELERATORS:
            out.append(f"{name}: unknown gpu_execution_accelerator {acc.get('name')!r}")
        if "precision_mode" in params and params["precision_mode"] not in TRT_PRECISIONS:
            out.append(
                f"{name}: precision_mode {params['precision_mode']!r} not in {TRT_PRECISIONS}"
            )
        cache = params.get("trt_engine_cache_path", "")
        if cache.startswith("/models"):
            out.append(
                f"{name}: trt_engine_cache_path {cache} is on the read-only model repository"
            )
    onnx_files = sorted(model_dir.glob("[0-9]*/model.onnx"))
    if onnx_files:
        signature = onnx_signature(onnx_files[0])
        for tname, dtype, _ in _tensors(gpu, "input") + _tensors(gpu, "output"):
            if tname not in signature:
                out.append(f"{name}: gpu.pbtxt tensor {tname} is not in the ONNX graph")
            elif signature[tname] != dtype:
                out.append(
                    f"{name}: {tname} is {dtype} in gpu.pbtxt, {signature[tname]} in the graph"
                )
    return out


def gpu_config_dirs(repo: Path = MODEL_REPOSITORY) -> list[Path]:
    return sorted(p.parent.parent for p in repo.glob("*/configs/gpu.pbtxt"))
