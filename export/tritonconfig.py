"""config.pbtxt derived from the exported artifact, and the check that keeps configs honest.

Configs are built as Triton's JSON form, rendered through ``model_config_pb2`` (so they always
parse), and cross-checked against the graph they serve: names, dtypes, ranks, batch axis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tritonforge.errors import ModelConfigError
from tritonforge.export.onnx_checks import Dim, graph_io
from tritonforge.export.spec import (
    BATCH_AXIS,
    TENSORRT_INT8_METHODS,
    ExportSpec,
    Inputs,
    Serving,
)
from tritonforge.modelconfig import TRITON_TO_NUMPY, pbtxt_to_dict, triton_dtype_of
from tritonforge.pipelines import PIPELINE_KEY, ROLE_KEY, TASK_KEY, VARIANT_KEY

GPU_CONFIG = Path("configs") / "gpu.pbtxt"
LABEL_FILE = "labels.txt"


@dataclass(frozen=True)
class IOTensor:
    """One tensor of a served artifact, batch axis included; dims: name (dynamic) or int."""

    name: str
    dtype: np.dtype
    dims: tuple[Dim, ...]


@dataclass(frozen=True)
class ArtifactIO:
    inputs: tuple[IOTensor, ...]
    outputs: tuple[IOTensor, ...]


def onnx_io(path: Path) -> ArtifactIO:
    ins, outs = graph_io(path)
    return ArtifactIO(
        tuple(IOTensor(n, d, tuple(s)) for n, d, s in ins),
        tuple(IOTensor(n, d, tuple(s)) for n, d, s in outs),
    )


def torchscript_io(spec: ExportSpec) -> ArtifactIO:
    """The native PyTorch backend's view: INPUT__i / OUTPUT__i in the spec's order."""
    return ArtifactIO(
        tuple(
            IOTensor(f"INPUT__{i}", np.dtype(t.dtype), tuple(t.axes))
            for i, t in enumerate(spec.inputs)
        ),
        tuple(
            IOTensor(f"OUTPUT__{i}", np.dtype(t.dtype), tuple(t.axes))
            for i, t in enumerate(spec.outputs)
        ),
    )


def torchscript_names(spec: ExportSpec) -> dict[str, str]:
    """Spec tensor name -> INPUT__i / OUTPUT__i."""
    names = {t.name: f"INPUT__{i}" for i, t in enumerate(spec.inputs)}
    names.update({t.name: f"OUTPUT__{i}" for i, t in enumerate(spec.outputs)})
    return names


def _config_dims(t: IOTensor, batched: bool) -> list[int]:
    dims = t.dims[1:] if batched else t.dims
    return [d if isinstance(d, int) else -1 for d in dims]


def _params(values: Mapping[str, str]) -> dict[str, dict[str, str]]:
    return {k: {"string_value": v} for k, v in values.items()}


def build_config(
    name: str,
    backend: str,
    filename: str,
    io: ArtifactIO,
    spec: ExportSpec,
    warmup: Inputs | None,
    gpu: bool = False,
    quantized: bool = False,
    int8_method: str = "",
) -> dict[str, Any]:
    """Triton's JSON form of the config for one artifact (CPU, or GPU with ``gpu=True``).

    A quantized graph TensorRT cannot build as INT8 (``int8_method`` not in
    :data:`TENSORRT_INT8_METHODS`, e.g. dynamic MatMulInteger) gets a GPU config equal to its CPU
    one: on a GPU host that variant stays on the host's CPU rather than being handed to TensorRT.
    """
    if gpu and quantized and int8_method not in TENSORRT_INT8_METHODS:
        gpu = False
    serving = spec.serving or Serving(fp32_name=name)
    batched = spec.max_batch > 0
    pad_names = {t.name: t.pad_value for t in spec.inputs if t.pad_value is not None}
    torchscript = backend == "pytorch"
    rename = torchscript_names(spec) if torchscript else {t.name: t.name for t in spec.inputs}
    params: dict[str, str] = {
        "pad_values": ",".join(f"{rename[k]}={v}" for k, v in pad_names.items()),
    }
    if torchscript:
        params["axis_names"] = ";".join(
            f"{t.name}:" + ",".join(d if isinstance(d, str) else "-" for d in t.dims)
            for t in (*io.inputs, *io.outputs)
        )
        params["INTRA_OP_THREAD_COUNT"] = str(serving.intra_op_threads)
        params["INTER_OP_THREAD_COUNT"] = str(serving.inter_op_threads)
        # Variable-length inputs: the JIT's profiling executor specialises and caches a graph per
        # shape seen, which grows memory for a long time (measured by `make soak`); the native
        # PyTorch backend and ours both read this key.
        params["DISABLE_OPTIMIZED_EXECUTION"] = "true"
    else:
        params["intra_op_thread_count"] = str(serving.intra_op_threads)
        params["inter_op_thread_count"] = str(serving.inter_op_threads)
        if not gpu:
            params.update(serving.session_config)
    if serving.pipeline:
        variant = {
            serving.fp32_name: "fp32",
            serving.int8_name: "int8",
            serving.torchscript_name: "torchscript",
        }.get(name, "")
        params.update(
            {
                PIPELINE_KEY: serving.pipeline,
                TASK_KEY: serving.task,
                ROLE_KEY: "encoder",
                VARIANT_KEY: variant,
            }
        )
    preferred = serving.gpu_preferred_batch_sizes if gpu else serving.preferred_batch_sizes
    config: dict[str, Any] = {
        "name": name,
        "backend": backend,
        "max_batch_size": spec.max_batch,
        "default_model_filename": filename,
        "input": [
            {
                "name": t.name,
                "data_type": triton_dtype_of(t.dtype),
                "dims": _config_dims(t, batched),
            }
            for t in io.inputs
        ],
        "output": [
            {
                "name": t.name,
                "data_type": triton_dtype_of(t.dtype),
                "dims": _config_dims(t, batched),
                # a classifier's logits name their classes (Triton's classification extension);
                # the pipeline writes the file next to the config
                **({"label_filename": LABEL_FILE} if serving.task == "classification" else {}),
            }
            for t in io.outputs
        ],
        "version_policy": (
            {"latest": {"num_versions": 1}}
            if serving.versions == (1,)
            else {"specific": {"versions": list(serving.versions)}}
        ),
        "instance_group": [
            {
                "count": serving.gpu_instance_count if gpu else serving.instance_count,
                "kind": "KIND_GPU" if gpu else "KIND_CPU",
            }
        ],
        "parameters": _params(params),
    }
    if serving.response_cache:
        config["response_cache"] = {"enable": True}
    if batched:
        config["dynamic_batching"] = {
            "max_queue_delay_microseconds": serving.gpu_max_queue_delay_us
            if gpu
            else serving.max_queue_delay_us,
        }
        if serving.priority_levels > 0:
            config["dynamic_batching"].update(priorities(serving.priority_levels))
        if any(b <= spec.max_batch for b in preferred):
            config["dynamic_batching"]["preferred_batch_size"] = [
                b for b in preferred if b <= spec.max_batch
            ]
        if serving.max_queue_size > 0:
            config["dynamic_batching"]["default_queue_policy"] = {
                "max_queue_size": serving.max_queue_size,
                "timeout_action": "REJECT",
                "default_timeout_microseconds": serving.queue_timeout_us,
                "allow_timeout_override": True,
            }
    if gpu and backend == "onnxruntime":
        precision = "INT8" if quantized else ("FP16" if serving.gpu_fp16 else "FP32")
        config["optimization"] = {
            "execution_accelerators": {
                "gpu_execution_accelerator": [
                    {
                        "name": "tensorrt",
                        "parameters": {
                            "precision_mode": precision,
                            "max_workspace_size_bytes": str(serving.gpu_max_workspace_bytes),
                            "trt_engine_cache_enable": "1",
                            "trt_engine_cache_path": "/tmp/trt_cache",
                        },
                    }
                ]
            },
            "cuda": {"graphs": False},
        }
    if warmup is not None:
        config["model_warmup"] = [
            {
                "name": "real_sample",
                "batch_size": 1,
                "inputs": {
                    rename[k]: {
                        "data_type": triton_dtype_of(v.dtype),
                        "dims": [int(d) for d in (v.shape[1:] if batched else v.shape)],
                        "input_data_file": rename[k],
                    }
                    for k, v in warmup.items()
                },
            }
        ]
    return config


def priorities(levels: int) -> dict[str, int]:
    """Triton's priority levels: level 1 is served first; unmarked requests get the last."""
    return {"priority_levels": levels, "default_priority_level": levels}


def render_pbtxt(config: Mapping[str, Any]) -> str:
    """Render Triton's JSON form as protobuf text (validated by ``model_config_pb2``)."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    msg = json_format.ParseDict(dict(config), model_config_pb2.ModelConfig())
    return str(text_format.MessageToString(msg))


def write_warmup_files(warmup: Inputs, directory: Path, rename: Mapping[str, str]) -> None:
    """Raw little-endian tensors (first row) Triton reads for ``model_warmup``."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, value in warmup.items():
        row = np.ascontiguousarray(value[0] if value.ndim > 1 else value)
        (directory / rename[name]).write_bytes(row.astype(row.dtype.newbyteorder("<")).tobytes())


def cross_check(config: Mapping[str, Any], io: ArtifactIO, where: str) -> list[str]:
    """Every mismatch between a parsed config and the artifact's tensors (empty = consistent)."""
    problems: list[str] = []
    mbs = int(config.get("max_batch_size", 0))
    batched = mbs > 0
    for kind, declared, actual in (
        ("input", config.get("input", []), io.inputs),
        ("output", config.get("output", []), io.outputs),
    ):
        by_name = {t.name: t for t in actual}
        names = [str(t.get("name")) for t in declared]
        for missing in sorted(set(by_name) - set(names)):
            problems.append(f"{where}: graph {kind} {missing!r} is not declared in the config")
        for t in declared:
            name = str(t.get("name"))
            if name not in by_name:
                problems.append(f"{where}: {kind} {name!r} does not exist in the artifact")
                continue
            g = by_name[name]
            want_dtype = TRITON_TO_NUMPY.get(str(t.get("data_type")))
            if want_dtype is None or np.dtype(want_dtype) != g.dtype:
                problems.append(
                    f"{where}: {kind} {name!r} data_type {t.get('data_type')} but the artifact "
                    f"has {g.dtype} ({triton_dtype_of(g.dtype)})"
                )
            dims = [int(d) for d in t.get("dims", [])]
            graph_dims = list(g.dims)
            if batched:
                if not graph_dims or isinstance(graph_dims[0], int):
                    problems.append(
                        f"{where}: max_batch_size {mbs} but {kind} {name!r} has no dynamic "
                        f"batch axis 0 (dims {graph_dims})"
                    )
                    continue
                if graph_dims[0] != BATCH_AXIS:
                    problems.append(
                        f"{where}: {kind} {name!r} axis 0 is {graph_dims[0]!r}, not {BATCH_AXIS!r}"
                    )
                graph_dims = graph_dims[1:]
            if len(dims) != len(graph_dims):
                problems.append(
                    f"{where}: {kind} {name!r} rank {len(dims)} (+batch) but the artifact has "
                    f"rank {len(graph_dims)} (+batch): config dims {dims}, artifact {graph_dims}"
                )
                continue
            for axis, (c, a) in enumerate(zip(dims, graph_dims, strict=True)):
                if isinstance(a, int) and c not in (a, -1):
                    problems.append(f"{where}: {kind} {name!r} dim {axis} is {c}, artifact {a}")
                if not isinstance(a, int) and c != -1:
                    problems.append(
                        f"{where}: {kind} {name!r} dim {axis} is {c} but the artifact axis is "
                        f"dynamic ({a!r}); use -1"
                    )
    for b in (config.get("dynamic_batching") or {}).get("preferred_batch_size", []):
        if batched and int(b) > mbs:
            problems.append(f"{where}: preferred_batch_size {b} > max_batch_size {mbs}")
    input_names = {str(t.get("name")) for t in config.get("input", [])}
    for warm in config.get("model_warmup", []):
        for name in warm.get("inputs", {}):
            if name not in input_names:
                problems.append(f"{where}: model_warmup input {name!r} is not a model input")
    return problems


def parse_config_file(path: Path) -> dict[str, Any]:
    try:
        return pbtxt_to_dict(path.read_text())
    except ModelConfigError as e:
        raise ModelConfigError(f"{path}: {e}") from e


def latest_version_dir(model_dir: Path) -> Path | None:
    versions = sorted((int(p.name), p) for p in model_dir.iterdir() if p.name.isdigit())
    return versions[-1][1] if versions else None


def check_repository(repo: Path, spec_lookup: Sequence[ExportSpec] = ()) -> list[str]:
    """Parse every config of ``repo`` (config.pbtxt and configs/*.pbtxt) with Triton's schema;
    cross-check onnxruntime configs against their graph and pytorch configs against the spec
    that exported them (found by model name in ``spec_lookup``)."""
    problems: list[str] = []
    for model_dir in sorted(p for p in repo.iterdir() if p.is_dir() and not p.name.startswith(".")):
        files = [model_dir / "config.pbtxt", *sorted((model_dir / "configs").glob("*.pbtxt"))]
        for path in files:
            if not path.exists():
                continue
            where = str(path.relative_to(repo))
            try:
                config = parse_config_file(path)
            except ModelConfigError as e:
                problems.append(str(e))
                continue
            if config.get("name") and config["name"] != model_dir.name:
                problems.append(f"{where}: name {config['name']!r} != directory {model_dir.name!r}")
            backend = config.get("backend") or config.get("platform", "")
            version = latest_version_dir(model_dir)
            if backend == "onnxruntime":
                filename = config.get("default_model_filename") or "model.onnx"
                if version is None or not (version / filename).exists():
                    problems.append(f"{where}: no version directory with {filename}")
                    continue
                problems += cross_check(config, onnx_io(version / filename), where)
            elif backend == "pytorch":
                spec = next(
                    (
                        s
                        for s in spec_lookup
                        if s.serving and s.serving.torchscript_name == model_dir.name
                    ),
                    None,
                )
                if spec is not None:
                    problems += cross_check(config, torchscript_io(spec), where)
    return problems
