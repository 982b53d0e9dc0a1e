"""Declarative export specs: everything model-specific the exporter needs, as data.

Adding a model means writing a function returning an :class:`ExportSpec` and registering it in
:mod:`export.specs`; the exporter itself never names a model.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from tritonforge.configschema import QueueLimits

Inputs = dict[str, np.ndarray]
ExampleFn = Callable[[Sequence[int], np.random.Generator], Inputs]
"""``(lengths, rng) -> inputs``: one row per length, padded to ``max(lengths)``."""
CorpusFn = Callable[[], list[Inputs]]

BATCH_AXIS = "batch_size"


@dataclass(frozen=True)
class TensorDecl:
    """A graph input or output. ``axes``: a name per dynamic axis, an int per fixed one."""

    name: str
    dtype: str
    axes: tuple[str | int, ...]
    pad_value: int | float | None = None  # inputs: value used to pad along dynamic axes
    atol: float = 0.0  # outputs: max |onnx - torch| allowed (with rtol, numpy.allclose rule)
    rtol: float = 0.0

    @property
    def dynamic_axes(self) -> dict[int, str]:
        return {i: a for i, a in enumerate(self.axes) if isinstance(a, str)}


GATE_METRICS = ("cosine", "top1")


@dataclass(frozen=True)
class QualityGate:
    """int8 vs fp32 on the held-out set, compared on ``output``.

    ``metric="cosine"`` (embeddings): mean and minimum cosine similarity per row.
    ``metric="top1"`` (classifier logits): the share of rows whose argmax agrees, and the largest
    absolute difference of any class probability (softmax of the logits).
    """

    output: str
    metric: str = "cosine"
    mean_cosine_min: float = 0.99
    min_cosine_min: float = 0.97
    top1_agreement_min: float = 0.99
    max_prob_diff_max: float = 0.1

    def __post_init__(self) -> None:
        if self.metric not in GATE_METRICS:
            raise ValueError(f"quality gate metric {self.metric!r} is not one of {GATE_METRICS}")

    def thresholds(self) -> dict[str, float]:
        if self.metric == "cosine":
            return {"mean_cosine_min": self.mean_cosine_min, "min_cosine_min": self.min_cosine_min}
        return {
            "top1_agreement_min": self.top1_agreement_min,
            "max_prob_diff_max": self.max_prob_diff_max,
        }


INT8_METHODS = ("dynamic", "static_qdq")
# Methods whose graph TensorRT builds as INT8 (explicit quantization: Q/DQ pairs, zero point 0).
TENSORRT_INT8_METHODS = ("static_qdq",)
CPU_TARGET, GPU_TARGET = "cpu", "gpu"
TARGETS = (CPU_TARGET, GPU_TARGET)


@dataclass(frozen=True)
class Quantization:
    """int8 settings (onnxruntime.quantization), with how int8 is made per deployment target.

    ``methods``: ``(target, method)`` pairs. ``"dynamic"`` quantizes the weights per channel
    offline and the activations per tensor at run time (MatMulInteger + DynamicQuantizeLinear:
    ONNX Runtime's VNNI/AMX int8 kernels on x86; TensorRT does not take these ops).
    ``"static_qdq"``: QuantizeLinear/DequantizeLinear pairs with activation ranges calibrated on
    the spec's calibration corpus (``quantize_static``, ``QuantFormat.QDQ``); with ``symmetric``
    every zero point is 0 (TensorRT's explicit-quantization INT8 requires it). The CPU target's
    graph is ``model.onnx``; another target's, when its method differs, sits beside it
    (:meth:`artifact_name`) and that target's config serves it.
    """

    methods: tuple[tuple[str, str], ...] = ((CPU_TARGET, "dynamic"), (GPU_TARGET, "static_qdq"))
    op_types: tuple[str, ...] = ("MatMul",)
    weights_only: bool = True  # MatMulConstBOnly: quantize MatMuls with a constant weight only
    per_channel: bool = True
    activation_type: str = "QInt8"  # static only (dynamic activations are always uint8)
    weight_type: str = "QInt8"
    symmetric: bool = True  # static only: ActivationSymmetric + WeightSymmetric (zero point 0)
    calibrate_method: str = "MinMax"
    # Sensitivity search: regexes grouping quantizable node names; greedy, at most this many rounds.
    sensitivity_groups: tuple[str, ...] = ()
    max_search_rounds: int = 3
    # Groups kept in fp32 from the first trial on (a setting measured earlier; the search still
    # runs when the gate fails with them), so a re-export runs one trial instead of the search.
    keep_fp32: tuple[str, ...] = ()
    # Per target, groups kept in fp32 instead of ``keep_fp32`` (a method has its own sensitivity).
    keep_fp32_by_target: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def __post_init__(self) -> None:
        targets = [t for t, _ in self.methods]
        if CPU_TARGET not in targets or len(set(targets)) != len(targets):
            raise ValueError(f"quantization methods {self.methods}: one per target, cpu included")
        for target, method in self.methods:
            if target not in TARGETS or method not in INT8_METHODS:
                raise ValueError(
                    f"quantization method {target}={method}: targets {TARGETS}, "
                    f"methods {INT8_METHODS}"
                )

    def method(self, target: str = CPU_TARGET) -> str:
        """How int8 is made for ``target`` (the CPU's method where the target declares none)."""
        return dict(self.methods).get(target) or dict(self.methods)[CPU_TARGET]

    def own_targets(self) -> tuple[str, ...]:
        """Targets that need a graph of their own (a method other than the CPU's), spec order."""
        return tuple(t for t, m in self.methods if t != CPU_TARGET and m != self.method())

    def artifact_name(self, target: str) -> str:
        """File name of ``target``'s int8 graph in the version directory."""
        if target == CPU_TARGET or target not in self.own_targets():
            return "model.onnx"
        return f"model.{self.method(target)}.onnx"

    def kept_fp32(self, target: str = CPU_TARGET) -> tuple[str, ...]:
        return dict(self.keep_fp32_by_target).get(target, self.keep_fp32)


@dataclass(frozen=True)
class GraphOptimization:
    """ONNX Runtime transformer optimizer settings (offline fusions)."""

    model_type: str = "bert"
    num_heads: int = 0
    hidden_size: int = 0


@dataclass(frozen=True)
class Serving(QueueLimits):
    """Triton config knobs; the exporter derives names, dtypes and dims from the graph.

    The queue knobs (:class:`QueueLimits`) are the CPU configs'. CPU: no batching delay and no
    preferred sizes. Batching pays little on a CPU (cost grows with the rows), so a lone request
    must not wait for a batch that is not coming; requests already queued when the instance frees
    up are still merged (docs/performance.md). Overload protection: at most ``max_queue_size``
    requests wait; the excess is refused at once (UNAVAILABLE) and none waits longer than the
    timeout (0 = unbounded queue).
    """

    fp32_name: str
    int8_name: str | None = None
    torchscript_name: str | None = None
    pipeline: str = ""  # filled in by the PipelineSpec (marks the encoders' configs)
    task: str = ""
    versions: tuple[int, ...] = (1,)  # served side by side (version_policy specific)
    response_cache: bool = False  # Triton's response cache (keyed by model version and inputs)
    priority_levels: int = 0  # filled in by the PipelineSpec (Triton priority levels)
    preferred_batch_sizes: tuple[int, ...] = ()
    # ONNX Runtime session config entries for the CPU configs. Spinning intra-op threads steal
    # the cores the Python stages and the Triton core need (measured: 24 -> 16 CPU ms/request).
    session_config: tuple[tuple[str, str], ...] = (("session.intra_op.allow_spinning", "0"),)
    instance_count: int = 1
    intra_op_threads: int = 2
    inter_op_threads: int = 1
    gpu_preferred_batch_sizes: tuple[int, ...] = (16, 32, 64)
    gpu_max_queue_delay_us: int = 2000
    gpu_instance_count: int = 1
    gpu_fp16: bool = True
    gpu_max_workspace_bytes: int = 1 << 30
    warmup_text: str = ""


@dataclass(frozen=True)
class ExportSpec:
    name: str
    description: str
    build_module: Callable[[], nn.Module]
    inputs: tuple[TensorDecl, ...]
    outputs: tuple[TensorDecl, ...]
    example_inputs: ExampleFn
    max_batch: int
    max_length: int
    opset: int = 17
    trace_lengths: tuple[int, ...] = (8, 5)  # example used for tracing: batch >= 2, seq >= 2
    # (batch, seq) shapes checked for parity, plus padded batches of mixed lengths.
    grid: tuple[tuple[int, int], ...] = ()
    mixed_batches: tuple[tuple[int, ...], ...] = ()
    benchmark_lengths: tuple[int, ...] = (64,) * 8  # rows of the in-process speed comparison
    calibration: CorpusFn | None = None
    calibration_source: str = ""
    evaluation: CorpusFn | None = None
    evaluation_source: str = ""
    quality_gate: QualityGate | None = None
    quantization: Quantization = field(default_factory=Quantization)
    optimization: GraphOptimization | None = None
    serving: Serving | None = None
    warmup: Callable[[], Inputs] | None = None
    # Task figures of each exported ONNX variant (e.g. a classifier's test accuracy and
    # macro-F1): ``runner -> {figure: value}``, run on fp32 and int8, kept in the report.
    task_metrics: Callable[[Callable[[Inputs], dict[str, np.ndarray]]], dict[str, Any]] | None = (
        None
    )
    source_files: tuple[Path, ...] = ()  # hashed: a change re-exports
    extra_files: tuple[tuple[Path, str], ...] = ()  # (source, repo-relative destination)

    def fingerprint_data(self) -> dict[str, Any]:
        """The declarative part of the spec as JSON-able data (callables by qualified name)."""

        def plain(value: Any) -> Any:
            if callable(value) and not isinstance(value, type):
                return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', '')}"
            if isinstance(value, Path):
                return str(value)
            if isinstance(value, Mapping):
                return {str(k): plain(v) for k, v in value.items()}
            if isinstance(value, list | tuple):
                return [plain(v) for v in value]
            return value

        data = {f: getattr(self, f) for f in self.__dataclass_fields__}
        for key in ("quality_gate", "quantization", "optimization", "serving"):
            if data[key] is not None:
                data[key] = asdict(data[key])
        data["inputs"] = [asdict(t) for t in self.inputs]
        data["outputs"] = [asdict(t) for t in self.outputs]
        return {k: plain(v) for k, v in data.items()}

    def input(self, name: str) -> TensorDecl:
        return next(t for t in self.inputs if t.name == name)

    def output(self, name: str) -> TensorDecl:
        return next(t for t in self.outputs if t.name == name)


def digest_json(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()
