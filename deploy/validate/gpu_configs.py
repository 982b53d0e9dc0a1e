"""``model_repository/*/configs/gpu.pbtxt`` against ``config.pbtxt`` and the graph it serves.

Offline and structural: what a GPU host would refuse or silently degrade is caught here, what
only a GPU can tell (engine builds, TensorRT's INT8 accuracy and speed) is listed in
:data:`UNCHECKED_WITHOUT_GPU` and printed by ``tritonforge deploy-check``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tritonforge.deploy.validate.paths import MODEL_REPOSITORY

# onnxruntime backend accelerators (Triton onnxruntime_backend README) and TensorRT precisions.
GPU_ACCELERATORS = {"tensorrt", "cuda"}
TRT_PRECISIONS = {"FP32", "FP16", "INT8"}
# The TensorRT accelerator's keys (onnxruntime_backend r24.10, src/onnxruntime.cc) by value
# type; the backend refuses any other key and a value that does not parse ("unknown parameter").
TRT_INT_KEYS = {
    "max_workspace_size_bytes",
    "trt_max_partition_iterations",
    "trt_min_subgraph_size",
    "trt_dla_core",
    "trt_builder_optimization_level",
    "trt_auxiliary_streams",
    "trt_ep_context_embed_mode",
}
TRT_BOOL_KEYS = {
    "int8_use_native_calibration_table",
    "trt_dla_enable",
    "trt_engine_cache_enable",
    "trt_dump_subgraphs",
    "trt_force_sequential_engine_build",
    "trt_context_memory_sharing_enable",
    "trt_layer_norm_fp32_fallback",
    "trt_timing_cache_enable",
    "trt_force_timing_cache",
    "trt_detailed_build_log",
    "trt_build_heuristics_enable",
    "trt_sparsity_enable",
    "trt_cuda_graph_enable",
    "trt_dump_ep_context_model",
}
TRT_STRING_KEYS = {
    "precision_mode",
    "int8_calibration_table_name",
    "trt_engine_cache_path",
    "trt_engine_cache_prefix",
    "trt_timing_cache_path",
    "trt_tactic_sources",
    "trt_extra_plugin_lib_paths",
    "trt_profile_min_shapes",
    "trt_profile_max_shapes",
    "trt_profile_opt_shapes",
    "trt_ep_context_file_path",
}
TRT_PATH_KEYS = {"trt_engine_cache_path", "trt_timing_cache_path"}
BOOL_VALUES = {"0", "1", "true", "false"}
READ_ONLY_MODELS = "/models"  # where the containers mount the model repository (read-only)
# Operators of dynamic (or operator-format) quantization: TensorRT's ONNX parser takes none of
# them; its INT8 comes from QuantizeLinear/DequantizeLinear pairs (explicit quantization).
NOT_TENSORRT_INT8 = {
    "MatMulInteger",
    "DynamicQuantizeLinear",
    "ConvInteger",
    "QLinearMatMul",
    "QLinearConv",
    "MatMulIntegerToFloat",
    "DynamicQuantizeMatMul",
    "QAttention",
}
QUANTIZABLE = {"MatMul", "Gemm", "Conv"}
UNCHECKED_WITHOUT_GPU = (
    "that TensorRT builds an engine from each graph (parser support, workspace, shapes up to "
    "max_batch_size x max length)",
    "which nodes TensorRT takes and which fall back to the CUDA execution provider (ONNX "
    "Runtime's fused com.microsoft operators of the fp32 graphs are not TensorRT operators)",
    "TensorRT's FP16/INT8 accuracy against the CPU and its latency (`make gpu-check` on a GPU "
    "host; the QDQ graph's quality gate ran on CPU with ONNX Runtime at export)",
    "the engine cache (`trt_engine_cache_path`) being writable in the container",
)


def _tensors(config: Mapping[str, Any], key: str) -> list[tuple[str, str, tuple[int, ...]]]:
    return sorted(
        (str(t["name"]), str(t.get("data_type")), tuple(t.get("dims", [])))
        for t in config.get(key, [])
    )


_ONNX_TYPES = {1: "TYPE_FP32", 7: "TYPE_INT64", 6: "TYPE_INT32", 10: "TYPE_FP16", 9: "TYPE_BOOL"}


def onnx_signature(model: Path) -> dict[str, str]:
    """``{tensor name: TYPE_*}`` of an ONNX graph's inputs and outputs (weights not loaded)."""
    return {name: dtype for name, (dtype, _) in onnx_tensors(model).items()}


def onnx_tensors(model: Path) -> dict[str, tuple[str, tuple[int | str | None, ...]]]:
    """``{tensor name: (TYPE_*, dims)}`` of a graph's inputs and outputs; a dim is its size,
    its symbolic name, or None when unknown."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    out: dict[str, tuple[str, tuple[int | str | None, ...]]] = {}
    for v in [*graph.input, *graph.output]:
        t = v.type.tensor_type
        dims = tuple(
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim
        )
        out[v.name] = (_ONNX_TYPES.get(t.elem_type, str(t.elem_type)), dims)
    return out


def accelerators(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    optimization = config.get("optimization") or {}
    return list(
        (optimization.get("execution_accelerators") or {}).get("gpu_execution_accelerator") or []
    )


def tensorrt_parameter_findings(name: str, params: Mapping[str, str]) -> list[str]:
    """The TensorRT accelerator's parameters: known keys, values that parse, writable paths."""
    out: list[str] = []
    for key, value in params.items():
        if key in TRT_INT_KEYS:
            try:
                number = int(value)
            except ValueError:
                out.append(f"{name}: TensorRT parameter {key}={value!r} is not an integer")
                continue
            if key == "max_workspace_size_bytes" and number <= 0:
                out.append(f"{name}: max_workspace_size_bytes {number} must be > 0")
        elif key in TRT_BOOL_KEYS:
            if value.lower() not in BOOL_VALUES:
                out.append(f"{name}: TensorRT parameter {key}={value!r}: use one of {BOOL_VALUES}")
        elif key not in TRT_STRING_KEYS:
            out.append(
                f"{name}: unknown TensorRT parameter {key!r} (the onnxruntime backend refuses "
                "to load the model)"
            )
    precision = params.get("precision_mode", "FP32")
    if precision not in TRT_PRECISIONS:
        out.append(f"{name}: precision_mode {precision!r} not in {TRT_PRECISIONS}")
    for key in sorted(TRT_PATH_KEYS & set(params)):
        path = params[key]
        if path.startswith(READ_ONLY_MODELS):
            out.append(f"{name}: {key} {path} is on the read-only model repository")
        elif not path.startswith("/"):
            out.append(f"{name}: {key} {path!r} must be absolute (the server's cwd is unknown)")
    if params.get("trt_engine_cache_enable", "0").lower() in ("1", "true") and not params.get(
        "trt_engine_cache_path"
    ):
        out.append(f"{name}: trt_engine_cache_enable without trt_engine_cache_path")
    return out


def tensorrt_int8_findings(name: str, model: Any, params: Mapping[str, str]) -> list[str]:
    """A graph given to TensorRT with ``precision_mode`` INT8, structurally.

    No dynamic-quantization operator; Q/DQ pairs (or, without any, a calibration table);
    TensorRT's explicit quantization: signed int8, zero points 0, every scale sane (the export's
    audit); each quantized MatMul/Gemm/Conv takes every input from a DequantizeLinear, an
    activation's DequantizeLinear from a QuantizeLinear, a weight's from a constant int8 tensor.
    """

    from tritonforge.export.int8_audit import audit_qdq

    counts: dict[str, int] = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    out = _int8_source_findings(name, counts, params.get("int8_calibration_table_name"))
    if not counts.get("QuantizeLinear", 0) + counts.get("DequantizeLinear", 0):
        return out
    problems, _ = audit_qdq(model)
    out += [f"{name}: {p}" for p in problems]
    graph = _GraphView(model.graph)
    out += _zero_point_findings(name, graph)
    return out + _qdq_pair_findings(name, graph)


def _int8_source_findings(
    name: str, counts: Mapping[str, int], calibration: str | None
) -> list[str]:
    """What says how to quantize: Q/DQ pairs or a calibration table, never dynamic operators."""
    out: list[str] = []
    dynamic = {op: n for op, n in sorted(counts.items()) if op in NOT_TENSORRT_INT8}
    if dynamic:
        ops = ", ".join(f"{n} {op}" for op, n in dynamic.items())
        out.append(
            f"{name}: precision_mode INT8 on a graph with {ops} (dynamic quantization): "
            "TensorRT builds INT8 only from QuantizeLinear/DequantizeLinear pairs; export the "
            "GPU target's static QDQ graph (`tritonforge export --target gpu`)"
        )
    qdq = counts.get("QuantizeLinear", 0) + counts.get("DequantizeLinear", 0)
    if not qdq and not calibration:
        out.append(
            f"{name}: precision_mode INT8 but the graph has no Q/DQ node and no "
            "int8_calibration_table_name is given (nothing says how to quantize)"
        )
    if qdq and calibration:
        out.append(
            f"{name}: int8_calibration_table_name on a Q/DQ graph (ONNX Runtime refuses to "
            "create the session)"
        )
    return out


class _GraphView:
    """An ONNX graph's nodes, each tensor's producer, and its constant value when it has one."""

    def __init__(self, graph: Any) -> None:
        self.nodes = list(graph.node)
        self.constants = {i.name: i for i in graph.initializer}
        self.producer = {o: n for n in graph.node for o in n.output}

    def const(self, tensor: str) -> Any:
        from onnx import numpy_helper

        if tensor in self.constants:
            return numpy_helper.to_array(self.constants[tensor])
        node = self.producer.get(tensor)
        if node is not None and node.op_type == "Constant":
            return numpy_helper.to_array(node.attribute[0].t)
        return None


def _zero_point_findings(name: str, graph: _GraphView) -> list[str]:
    """Every Q/DQ node quantizes to signed int8, symmetrically (zero point 0)."""
    import numpy as np

    out: list[str] = []
    for node in graph.nodes:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        zp = graph.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if zp is None:
            if node.op_type == "QuantizeLinear":
                out.append(
                    f"{name}: QuantizeLinear {node.name} has no zero point, so it quantizes to "
                    "uint8 (the ONNX default); TensorRT's INT8 is signed int8"
                )
            continue
        if zp.dtype != np.int8:
            out.append(
                f"{name}: {node.op_type} {node.name} is {zp.dtype} (TensorRT's INT8 is signed int8)"
            )
        elif np.any(zp != 0):
            out.append(
                f"{name}: {node.op_type} {node.name} has a non-zero zero point (TensorRT "
                "quantizes symmetrically: zero point 0)"
            )
    return out


def _qdq_pair_findings(name: str, graph: _GraphView) -> list[str]:
    """Each quantized MatMul/Gemm/Conv is fed by a Q/DQ pair (or a constant int8 weight) on
    every input, and at least one is."""
    out: list[str] = []
    quantized = 0
    for node in graph.nodes:
        if node.op_type not in QUANTIZABLE:
            continue
        feeds = [graph.producer.get(i) for i in node.input[:2]]
        from_dq = [f is not None and f.op_type == "DequantizeLinear" for f in feeds]
        if not any(from_dq):
            continue
        quantized += 1
        if not all(from_dq):
            out.append(
                f"{name}: {node.op_type} {node.name} has one input from a DequantizeLinear and "
                "one in float, not a Q/DQ pair on every input (the explicit-quantization "
                "pattern TensorRT fuses into an INT8 layer)"
            )
            continue
        out += [_dequantize_finding(name, node.name, dq, graph) for dq in feeds if dq is not None]
    if not quantized:
        out.append(f"{name}: precision_mode INT8 but no MatMul/Gemm/Conv is fed by Q/DQ pairs")
    return [line for line in out if line]


def _dequantize_finding(name: str, consumer: str, dq: Any, graph: _GraphView) -> str:
    """ "" when the DequantizeLinear ``dq`` reads a constant int8 weight or a QuantizeLinear."""
    import numpy as np

    weight = graph.const(dq.input[0])
    if weight is not None:
        if weight.dtype != np.int8:
            return f"{name}: weight {dq.input[0]} of {consumer} is {weight.dtype}"
        return ""
    source = graph.producer.get(dq.input[0])
    if source is None or source.op_type != "QuantizeLinear":
        return (
            f"{name}: DequantizeLinear {dq.name} feeding {consumer} is not paired with "
            "a QuantizeLinear (nor a constant int8 weight)"
        )
    return ""


def quantized_matmuls(model: Any) -> dict[str, tuple[int, int]]:
    """``{"weight": (int8, all), "activation": (int8, all)}``: MatMuls with a constant weight and
    MatMuls of two activations (attention scores/context), and how many of each take Q/DQ inputs."""
    graph = model.graph
    constants = {i.name for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    counts = {"weight": [0, 0], "activation": [0, 0]}
    for node in graph.node:
        if node.op_type != "MatMul":
            continue
        source = producer.get(node.input[1])
        dq = source is not None and source.op_type == "DequantizeLinear"
        weight_input = source.input[0] if dq and source is not None else node.input[1]
        kind = "weight" if weight_input in constants else "activation"
        counts[kind][1] += 1
        counts[kind][0] += dq
    return {k: (v[0], v[1]) for k, v in counts.items()}


def _served_file(model_dir: Path, config: Mapping[str, Any]) -> Path | None:
    """The latest version's file a config serves (``default_model_filename``)."""
    versions = sorted((int(p.name), p) for p in model_dir.iterdir() if p.name.isdigit())
    if not versions:
        return None
    return versions[-1][1] / str(config.get("default_model_filename") or "model.onnx")


def _load_gpu(model_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    from tritonforge.modelconfig import pbtxt_to_dict

    base = pbtxt_to_dict((model_dir / "config.pbtxt").read_text())
    gpu = pbtxt_to_dict((model_dir / "configs" / "gpu.pbtxt").read_text())
    return base, gpu


def gpu_config_findings(model_dir: Path) -> list[str]:
    """``configs/gpu.pbtxt`` of one model: parses; same interface (names, dtypes, dims,
    batching) as ``config.pbtxt``; KIND_GPU, or a deliberate CPU fallback (every instance
    KIND_CPU and no GPU accelerator); well-formed TensorRT parameters; the file it serves
    exists and has the declared tensors; INT8 only on a graph TensorRT can build as INT8."""
    from tritonforge.errors import ModelConfigError

    name = model_dir.name
    try:
        base, gpu = _load_gpu(model_dir)
    except (OSError, ModelConfigError) as e:
        return [f"{name}: {e}"]
    out: list[str] = []
    if gpu.get("name", name) != name:
        out.append(f"{name}: gpu.pbtxt names the model {gpu.get('name')!r}")
    for key in ("backend", "platform", "max_batch_size"):
        if base.get(key) != gpu.get(key):
            out.append(
                f"{name}: {key} differs: config.pbtxt {base.get(key)!r}, gpu.pbtxt {gpu.get(key)!r}"
            )
    for key in ("input", "output"):
        if _tensors(base, key) != _tensors(gpu, key):
            out.append(f"{name}: {key}s differ between config.pbtxt and gpu.pbtxt")
    kinds = {g.get("kind") for g in gpu.get("instance_group") or []}
    accs = accelerators(gpu)
    if kinds != {"KIND_GPU"} and not (kinds == {"KIND_CPU"} and not accs):
        out.append(
            f"{name}: every instance_group of gpu.pbtxt must be KIND_GPU (or, for a model kept "
            "on the CPU, every one KIND_CPU with no gpu_execution_accelerator)"
        )
    tensorrt: dict[str, str] | None = None
    for acc in accs:
        params = {str(k): str(v) for k, v in (acc.get("parameters") or {}).items()}
        if acc.get("name") not in GPU_ACCELERATORS:
            out.append(f"{name}: unknown gpu_execution_accelerator {acc.get('name')!r}")
        elif acc.get("name") == "tensorrt":
            tensorrt = params
            out += tensorrt_parameter_findings(name, params)
    served = _served_file(model_dir, gpu)
    if served is None or gpu.get("backend") != "onnxruntime":
        return out
    if not served.is_file():
        out.append(f"{name}: gpu.pbtxt serves {served.name}, which is not in {served.parent}")
        return out
    out += _graph_findings(name, served, gpu, tensorrt)
    return out


def _graph_findings(
    name: str, served: Path, gpu: Mapping[str, Any], tensorrt: Mapping[str, str] | None
) -> list[str]:
    out: list[str] = []
    tensors = onnx_tensors(served)
    batched = int(gpu.get("max_batch_size", 0)) > 0
    for tname, dtype, dims in _tensors(gpu, "input") + _tensors(gpu, "output"):
        if tname not in tensors:
            out.append(f"{name}: gpu.pbtxt tensor {tname} is not in the ONNX graph")
            continue
        graph_dtype, graph_dims = tensors[tname]
        if graph_dtype != dtype:
            out.append(f"{name}: {tname} is {dtype} in gpu.pbtxt, {graph_dtype} in the graph")
        shown = graph_dims[1:] if batched else graph_dims
        want = tuple(d if isinstance(d, int) and d > 0 else -1 for d in shown)
        if tuple(int(d) for d in dims) != want:
            out.append(
                f"{name}: {tname} dims {list(dims)} in gpu.pbtxt, {list(want)} in "
                f"{served.name} (batch axis dropped)"
            )
    precision = (tensorrt or {}).get("precision_mode", "FP32")
    if tensorrt is not None:
        import onnx

        model = onnx.load(str(served))
        if precision == "INT8":
            out += tensorrt_int8_findings(f"{name} ({served.name})", model, tensorrt)
        else:
            dynamic = sorted({n.op_type for n in model.graph.node} & NOT_TENSORRT_INT8)
            if dynamic:
                out.append(
                    f"{name}: TensorRT ({precision}) is given a dynamically quantized graph "
                    f"({', '.join(dynamic)}): TensorRT takes none of these operators"
                )
    return out


def gpu_config_notes(model_dir: Path) -> list[str]:
    """What the GPU config of one model does, for the check's output (not findings)."""
    from tritonforge.errors import ModelConfigError

    try:
        _, gpu = _load_gpu(model_dir)
    except (OSError, ModelConfigError):
        return []
    served = _served_file(model_dir, gpu)
    served_name = served.name if served is not None else "?"
    tensorrt = next((a for a in accelerators(gpu) if a.get("name") == "tensorrt"), None)
    if gpu.get("backend") != "onnxruntime":
        return [f"{model_dir.name}: {gpu.get('backend')} backend on the GPU ({served_name})"]
    if tensorrt is None:
        kinds = {g.get("kind") for g in gpu.get("instance_group") or []}
        if kinds == {"KIND_CPU"}:
            return [
                f"{model_dir.name}: stays on the host CPU on GPU hosts ({served_name}; its int8 "
                "method has no TensorRT INT8 path; `tritonforge export --target gpu` builds one)"
            ]
        return [f"{model_dir.name}: {served_name} on the CUDA execution provider"]
    precision = (tensorrt.get("parameters") or {}).get("precision_mode", "FP32")
    detail = ""
    if served is not None and served.is_file():
        import onnx

        model = onnx.load(str(served))
        if precision == "INT8":
            counts = quantized_matmuls(model)
            detail = ", int8 (Q/DQ): " + ", ".join(
                f"{q} of {total} {kind} MatMuls" for kind, (q, total) in counts.items() if total
            )
        contrib = sorted({n.op_type for n in model.graph.node if n.domain not in ("", "ai.onnx")})
        if contrib:
            detail += (
                f"; ONNX Runtime's own operators ({', '.join(contrib)}) are not TensorRT's: "
                "those nodes run on the CUDA provider (unverified without a GPU)"
            )
    return [f"{model_dir.name}: TensorRT {precision} on {served_name}{detail}"]


def gpu_config_dirs(repo: Path = MODEL_REPOSITORY) -> list[Path]:
    return sorted(p.parent.parent for p in repo.glob("*/configs/gpu.pbtxt"))
