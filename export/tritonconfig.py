"""config.pbtxt derived from the exported artifact, and the check that keeps configs honest.

Configs are built as typed :class:`~tritonforge.configschema.TritonConfig` (the one model-config
layer), rendered through ``model_config_pb2`` (so they always parse), and cross-checked against
the graph they serve: names, dtypes, ranks, batch axis.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec

import numpy as np

from tritonforge import configschema, tasks
from tritonforge.configschema import (
    Accelerator,
    DynamicBatching,
    InstanceGroup,
    Optimization,
    TritonConfig,
    VersionPolicy,
    Warmup,
    WarmupInput,
    params,
)
from tritonforge.errors import ModelConfigError
from tritonforge.export.onnx_checks import Dim, graph_io
from tritonforge.export.spec import (
    BATCH_AXIS,
    TENSORRT_INT8_METHODS,
    ExportSpec,
    Inputs,
    Serving,
)
from tritonforge.modelconfig import TRITON_TO_NUMPY, TensorSpec, pbtxt_to_dict, triton_dtype_of
from tritonforge.pipelines import PIPELINE_KEY, ROLE_KEY, TASK_KEY, VARIANT_KEY

GPU_CONFIG = Path("configs") / "gpu.pbtxt"
P = ParamSpec("P")
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


def _encoder_params(
    name: str, backend: str, io: ArtifactIO, spec: ExportSpec, serving: Serving, gpu: bool
) -> dict[str, str]:
    """``parameters`` of an encoder: padding, threads, session config and pipeline marks."""
    torchscript = backend == "pytorch"
    rename = torchscript_names(spec) if torchscript else {t.name: t.name for t in spec.inputs}
    pads = ((t.name, t.pad_value) for t in spec.inputs if t.pad_value is not None)
    params: dict[str, str] = {"pad_values": ",".join(f"{rename[k]}={v}" for k, v in pads)}
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
    return params


def _tensors(
    tensors: Sequence[IOTensor], batched: bool, label_filename: str = ""
) -> tuple[TensorSpec, ...]:
    return tuple(
        TensorSpec(
            t.name,
            triton_dtype_of(t.dtype),
            tuple(_config_dims(t, batched)),
            label_filename=label_filename,
        )
        for t in tensors
    )


def _batching(serving: Serving, max_batch: int, gpu: bool) -> DynamicBatching:
    preferred = serving.gpu_preferred_batch_sizes if gpu else serving.preferred_batch_sizes
    delay_us = serving.gpu_max_queue_delay_us if gpu else serving.max_queue_delay_us
    return dataclasses.replace(
        DynamicBatching.of(serving, serving.priority_levels, delay_us),
        preferred_batch_sizes=tuple(b for b in preferred if b <= max_batch),
    )


def _tensorrt(serving: Serving, quantized: bool) -> Optimization:
    """TensorRT inside ONNX Runtime, engines cached on disk; no CUDA graphs."""
    precision = "INT8" if quantized else ("FP16" if serving.gpu_fp16 else "FP32")
    settings = {
        "precision_mode": precision,
        "max_workspace_size_bytes": str(serving.gpu_max_workspace_bytes),
        "trt_engine_cache_enable": "1",
        "trt_engine_cache_path": "/tmp/trt_cache",
    }
    return Optimization((Accelerator("tensorrt", params(settings)),), cuda_graphs=False)


def _warmup(warmup: Inputs, rename: Mapping[str, str], batched: bool) -> Warmup:
    """One real sample (batch 1), read from the raw files :func:`write_warmup_files` writes."""
    return Warmup(
        "real_sample",
        tuple(
            WarmupInput(
                rename[k],
                triton_dtype_of(v.dtype),
                tuple(int(d) for d in (v.shape[1:] if batched else v.shape)),
                rename[k],
            )
            for k, v in warmup.items()
        ),
    )


def encoder_config(
    name: str,
    backend: str,
    filename: str,
    io: ArtifactIO,
    spec: ExportSpec,
    warmup: Inputs | None,
    gpu: bool = False,
    quantized: bool = False,
    int8_method: str = "",
) -> TritonConfig:
    """The typed config of one artifact (CPU, or GPU with ``gpu=True``).

    A quantized graph TensorRT cannot build as INT8 (``int8_method`` not in
    :data:`TENSORRT_INT8_METHODS`, e.g. dynamic MatMulInteger) gets a GPU config equal to its CPU
    one: on a GPU host that variant stays on the host's CPU rather than being handed to TensorRT.
    """
    if gpu and quantized and int8_method not in TENSORRT_INT8_METHODS:
        gpu = False
    serving = spec.serving or Serving(fp32_name=name)
    batched = spec.max_batch > 0
    torchscript = backend == "pytorch"
    rename = torchscript_names(spec) if torchscript else {t.name: t.name for t in spec.inputs}
    # a classifier's logits name their classes (Triton's classification extension); the
    # pipeline writes the file next to the config
    labels = LABEL_FILE if serving.task and tasks.get(serving.task).labels else ""
    count = serving.gpu_instance_count if gpu else serving.instance_count
    return TritonConfig(
        name=name,
        backend=backend,
        max_batch_size=spec.max_batch,
        default_model_filename=filename,
        inputs=_tensors(io.inputs, batched),
        outputs=_tensors(io.outputs, batched, labels),
        version_policy=VersionPolicy.serving(serving.versions),
        instance_groups=(InstanceGroup(count, "KIND_GPU" if gpu else "KIND_CPU"),),
        parameters=params(_encoder_params(name, backend, io, spec, serving, gpu)),
        response_cache=serving.response_cache,
        dynamic_batching=_batching(serving, spec.max_batch, gpu) if batched else None,
        optimization=_tensorrt(serving, quantized) if gpu and backend == "onnxruntime" else None,
        warmup=(_warmup(warmup, rename, batched),) if warmup is not None else (),
    )


def _json_form(build: Callable[P, TritonConfig]) -> Callable[P, dict[str, Any]]:
    """``build`` returning Triton's JSON form of its config instead (same parameters)."""

    @functools.wraps(build)
    def json_form(*args: P.args, **kwargs: P.kwargs) -> dict[str, Any]:
        return build(*args, **kwargs).to_json()

    return json_form


# Triton's JSON form of :func:`encoder_config` (same arguments), for callers that edit dicts.
build_config = _json_form(encoder_config)


def render_pbtxt(config: TritonConfig | Mapping[str, Any]) -> str:
    """Render a config (typed, or Triton's JSON form) as protobuf text, validated by
    ``model_config_pb2`` (:func:`tritonforge.configschema.render_pbtxt`)."""
    return configschema.render_pbtxt(config)


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
