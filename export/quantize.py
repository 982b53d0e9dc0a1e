"""int8 quantization (dynamic, or static QDQ with calibration), the scale/zero-point audit of
either format, the cosine gate and the greedy sensitivity search that finds which weight groups
must stay in fp32."""

from __future__ import annotations

import contextlib
import io
import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from tritonforge.export.errors import QualityGateError
from tritonforge.export.parity import Runner, ort_runner
from tritonforge.export.spec import (
    CPU_TARGET,
    INT8_METHODS,
    ExportSpec,
    Inputs,
    QualityGate,
    Quantization,
)

MIN_SCALE = 1e-8


class _Reader:
    """CalibrationDataReader over a list of input dicts (restartable)."""

    def __init__(self, batches: Sequence[Inputs], names: set[str]) -> None:
        self.batches = [{k: v for k, v in b.items() if k in names} for b in batches]
        self._it = iter(self.batches)

    def get_next(self) -> Inputs | None:
        return next(self._it, None)

    def rewind(self) -> None:
        self._it = iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def weight_matmuls(path: Path, op_types: Sequence[str]) -> dict[str, int]:
    """Quantizable nodes with a constant weight: node name -> number of weight elements."""
    model = onnx.load(str(path))
    inits = {i.name: i for i in model.graph.initializer}
    out = {}
    for node in model.graph.node:
        if node.op_type in op_types and len(node.input) > 1 and node.input[1] in inits:
            out[node.name] = int(np.prod(inits[node.input[1]].dims))
    return out


def quantize_int8(
    src: Path,
    dst: Path,
    settings: Quantization,
    calibration: Sequence[Inputs],
    cache: Path,
    exclude: Sequence[str] = (),
    target: str = CPU_TARGET,
) -> None:
    """int8 quantization of ``src`` by ``settings.method(target)``; for static QDQ the
    calibration ranges are computed once into ``cache`` (dynamic quantization needs none)."""
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    names = {i.name for i in onnx.load(str(src), load_external_data=False).graph.input}
    logging.getLogger().setLevel(logging.ERROR)
    method = settings.method(target)
    if method not in INT8_METHODS:
        raise ValueError(f"quantization method {method!r}: use one of {INT8_METHODS}")
    if method == "dynamic":
        with contextlib.redirect_stdout(io.StringIO()):
            quantize_dynamic(
                str(src),
                str(dst),
                op_types_to_quantize=list(settings.op_types),
                per_channel=settings.per_channel,
                weight_type=QuantType[settings.weight_type],
                nodes_to_exclude=list(exclude),
                # The source may hold ORT's fused contrib ops (no ONNX shape inference for them).
                extra_options={
                    "MatMulConstBOnly": settings.weights_only,
                    "DefaultTensorType": onnx.TensorProto.FLOAT,
                },
            )
        return
    with contextlib.redirect_stdout(io.StringIO()):
        quantize_static(
            str(src),
            str(dst),
            _Reader(calibration, names),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=list(settings.op_types),
            per_channel=settings.per_channel,
            activation_type=QuantType[settings.activation_type],
            weight_type=QuantType[settings.weight_type],
            nodes_to_exclude=list(exclude),
            calibrate_method=CalibrationMethod[settings.calibrate_method],
            extra_options={
                "MatMulConstBOnly": settings.weights_only,
                "ActivationSymmetric": settings.symmetric,
                "WeightSymmetric": settings.symmetric,
            },
            calibration_cache_path=str(cache),
        )


# -- audit ------------------------------------------------------------------------------------
def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(attr.t)
    return values


def _ranks(model: onnx.ModelProto, constants: dict[str, np.ndarray]) -> dict[str, int]:
    ranks = {k: v.ndim for k, v in constants.items()}
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        inferred = model
    for vi in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output):
        if vi.type.tensor_type.HasField("shape"):
            ranks.setdefault(vi.name, len(vi.type.tensor_type.shape.dim))
    return ranks


def audit_qdq(model: onnx.ModelProto) -> tuple[list[str], dict[str, int]]:
    """Check every QuantizeLinear/DequantizeLinear; returns ``(problems, counts)``.

    Scale: constant, finite, > 0 and >= 1e-8 (not denormal). Zero point: integer dtype, within
    its range, same shape as the scale. Per-channel: axis valid for the input's rank and the
    scale's length equal to that axis' size. Pairs: every Q feeds only DQs that use the same
    scale, zero point and axis.
    """
    problems: list[str] = []
    constants = _constants(model)
    ranks = _ranks(model, constants)
    nodes = [n for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    counts = {
        "QuantizeLinear": sum(n.op_type == "QuantizeLinear" for n in nodes),
        "DequantizeLinear": sum(n.op_type == "DequantizeLinear" for n in nodes),
    }
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    params: dict[str, tuple[np.ndarray | None, np.ndarray | None, int]] = {}
    for index, node in enumerate(nodes):
        label = f"{node.op_type} {node.name or f'#{index}'}"
        axis = next((int(a.i) for a in node.attribute if a.name == "axis"), 1)
        scale = constants.get(node.input[1]) if len(node.input) > 1 else None
        zp = constants.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        params[node.name] = (scale, zp, axis)
        if scale is None:
            problems.append(f"{label}: scale {node.input[1]!r} is not a constant")
            continue
        s = scale.astype(np.float64)
        bad = ~np.isfinite(s)
        if bad.any():
            problems.append(
                f"{label}: scale {node.input[1]!r} has {int(bad.sum())} non-finite value(s)"
            )
        finite = s[np.isfinite(s)]
        if (finite <= 0).any():
            problems.append(
                f"{label}: scale {node.input[1]!r} has {int((finite <= 0).sum())} value(s) <= 0"
            )
        tiny = (finite > 0) & (finite < MIN_SCALE)
        if tiny.any():
            problems.append(
                f"{label}: scale {node.input[1]!r} has {int(tiny.sum())} value(s) below "
                f"{MIN_SCALE:g} (denormal range)"
            )
        if zp is not None:
            if zp.dtype.kind not in "iu":
                problems.append(f"{label}: zero point dtype {zp.dtype} is not an integer type")
            else:
                info = np.iinfo(zp.dtype)
                if zp.size and (zp.min() < info.min or zp.max() > info.max):
                    problems.append(f"{label}: zero point outside {zp.dtype} range")
            if zp.shape != scale.shape:
                problems.append(
                    f"{label}: zero point shape {zp.shape} != scale shape {scale.shape}"
                )
        if scale.ndim == 1 and scale.size > 1:
            rank = ranks.get(node.input[0])
            if rank is None:
                problems.append(
                    f"{label}: per-channel but the rank of {node.input[0]!r} is unknown"
                )
            elif not -rank <= axis < rank:
                problems.append(f"{label}: per-channel axis {axis} invalid for rank {rank}")
            elif node.input[0] in constants:
                size = constants[node.input[0]].shape[axis]
                if size != scale.size:
                    problems.append(
                        f"{label}: per-channel scale has {scale.size} values but axis {axis} of "
                        f"{node.input[0]!r} has size {size}"
                    )
        elif scale.ndim > 1:
            problems.append(f"{label}: scale rank {scale.ndim} (blocked) is not supported here")
    for node in nodes:
        if node.op_type != "QuantizeLinear":
            continue
        s1, z1, a1 = params[node.name]
        for user in consumers.get(node.output[0], []):
            if user.op_type != "DequantizeLinear":
                problems.append(
                    f"QuantizeLinear {node.name}: output feeds {user.op_type} {user.name}, "
                    "not a DequantizeLinear"
                )
                continue
            s2, z2, a2 = params[user.name]
            same = (
                s1 is not None
                and s2 is not None
                and s1.shape == s2.shape
                and np.array_equal(s1, s2, equal_nan=True)
                and (
                    (z1 is None and z2 is None)
                    or (
                        z1 is not None
                        and z2 is not None
                        and z1.dtype == z2.dtype
                        and np.array_equal(z1, z2)
                    )
                )
                and (s1.size == 1 or a1 == a2)
            )
            if not same:
                problems.append(
                    f"Q/DQ pair {node.name} -> {user.name}: scale/zero point/axis differ"
                )
    return problems, counts


def _check_scale(label: str, name: str, scale: np.ndarray, problems: list[str]) -> None:
    s = scale.astype(np.float64)
    bad = ~np.isfinite(s)
    if bad.any():
        problems.append(f"{label}: scale {name!r} has {int(bad.sum())} non-finite value(s)")
    finite = s[np.isfinite(s)]
    if (finite <= 0).any():
        problems.append(f"{label}: scale {name!r} has {int((finite <= 0).sum())} value(s) <= 0")
    tiny = (finite > 0) & (finite < MIN_SCALE)
    if tiny.any():
        problems.append(
            f"{label}: scale {name!r} has {int(tiny.sum())} value(s) below {MIN_SCALE:g} "
            "(denormal range)"
        )


def audit_dynamic(model: onnx.ModelProto) -> tuple[list[str], dict[str, int]]:
    """Check every MatMulInteger of a dynamically quantized graph; ``(problems, counts)``.

    Weight: a constant 2-D integer tensor. Weight zero point: constant, integer, within range,
    one value or one per output channel. Weight scale (the constant factor of the
    ``a_scale * b_scale`` Mul that rescales the int32 result): finite, > 0, >= 1e-8, one value or
    one per output channel, as many as the zero points. Activations: quantized at run time by a
    DynamicQuantizeLinear (its scale/zero point are computed, not stored).
    """
    problems: list[str] = []
    constants = _constants(model)
    producer = {o: n for n in model.graph.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    matmuls = [n for n in model.graph.node if n.op_type == "MatMulInteger"]
    counts = {
        "MatMulInteger": len(matmuls),
        "DynamicQuantizeLinear": sum(
            n.op_type == "DynamicQuantizeLinear" for n in model.graph.node
        ),
    }
    for index, node in enumerate(matmuls):
        label = f"MatMulInteger {node.name or f'#{index}'}"
        a_src = producer.get(node.input[0])
        if a_src is None or a_src.op_type != "DynamicQuantizeLinear":
            problems.append(f"{label}: activation is not quantized by a DynamicQuantizeLinear")
        weight = constants.get(node.input[1])
        if weight is None or weight.dtype.kind not in "iu" or weight.ndim != 2:
            problems.append(f"{label}: weight {node.input[1]!r} is not a constant 2-D int tensor")
            continue
        channels = weight.shape[1]
        zp = constants.get(node.input[3]) if len(node.input) > 3 and node.input[3] else None
        if zp is None:
            problems.append(f"{label}: weight zero point is missing or not a constant")
        else:
            if zp.dtype != weight.dtype:
                problems.append(f"{label}: zero point dtype {zp.dtype} != weight {weight.dtype}")
            if zp.size not in (1, channels):
                problems.append(f"{label}: {zp.size} zero points for {channels} channels")
        cast = next(iter(consumers.get(node.output[0], [])), None)
        rescale = next(iter(consumers.get(cast.output[0], []))) if cast is not None else None
        if cast is None or cast.op_type != "Cast" or rescale is None or rescale.op_type != "Mul":
            problems.append(f"{label}: result is not rescaled by Cast -> Mul")
            continue
        factor = next((producer.get(i) for i in rescale.input if producer.get(i) is not cast), None)
        scales = [
            constants[i] for i in (factor.input if factor is not None else ()) if i in constants
        ]
        if factor is None or factor.op_type != "Mul" or len(scales) != 1:
            problems.append(f"{label}: no constant weight scale in the rescaling Mul")
            continue
        _check_scale(label, factor.input[-1], scales[0], problems)
        if scales[0].size not in (1, channels) or (zp is not None and zp.size != scales[0].size):
            problems.append(
                f"{label}: {scales[0].size} scales for {channels} channels"
                + (f" and {zp.size} zero points" if zp is not None else "")
            )
    return problems, counts


def audit_int8(model: onnx.ModelProto) -> tuple[list[str], dict[str, int]]:
    """Both audits (QDQ pairs and dynamic MatMulInteger); a graph has the nodes of one format."""
    qdq, qdq_counts = audit_qdq(model)
    dyn, dyn_counts = audit_dynamic(model)
    if not any((*qdq_counts.values(), *dyn_counts.values())):
        return ["no quantized node in the int8 graph"], {**qdq_counts, **dyn_counts}
    return qdq + dyn, {**qdq_counts, **dyn_counts}


# -- quality gate and search ------------------------------------------------------------------
def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    num = (a64 * b64).sum(-1)
    den = np.linalg.norm(a64, axis=-1) * np.linalg.norm(b64, axis=-1)
    return np.asarray(num / np.maximum(den, 1e-12))


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return np.asarray(e / e.sum(axis=-1, keepdims=True))


def gate_figures(
    runner: Runner, evaluation: Sequence[Inputs], reference: Sequence[np.ndarray], gate: QualityGate
) -> dict[str, float]:
    """The gate's figures of ``runner`` against ``reference`` (fp32) on ``evaluation``."""
    got = [runner(b)[gate.output] for b in evaluation]
    rows = int(sum(len(r) for r in reference))
    if gate.metric == "top1":
        agree = np.concatenate(
            [g.argmax(-1) == r.argmax(-1) for g, r in zip(got, reference, strict=True)]
        )
        diff = np.concatenate(
            [np.abs(softmax(g) - softmax(r)).max(-1) for g, r in zip(got, reference, strict=True)]
        )
        return {
            "top1_agreement": float(agree.mean()) if agree.size else math.nan,
            "max_prob_diff": float(diff.max()) if diff.size else math.nan,
            "mean_prob_diff": float(diff.mean()) if diff.size else math.nan,
            "sentences": rows,
        }
    cos = np.concatenate([cosines(g, r) for g, r in zip(got, reference, strict=True)])
    mean = float(cos.mean()) if cos.size else math.nan
    low = float(cos.min()) if cos.size else math.nan
    return {"mean_cosine": mean, "min_cosine": low, "sentences": rows}


def passes(fig: dict[str, float], gate: QualityGate) -> bool:
    if gate.metric == "top1":
        return (
            fig["top1_agreement"] >= gate.top1_agreement_min
            and fig["max_prob_diff"] <= gate.max_prob_diff_max
        )
    return fig["mean_cosine"] >= gate.mean_cosine_min and fig["min_cosine"] >= gate.min_cosine_min


def score(fig: dict[str, float], gate: QualityGate) -> float:
    """Higher is better (ranks the search's candidates)."""
    if gate.metric == "top1":
        return fig["top1_agreement"] - 1e-3 * fig["max_prob_diff"]
    return fig["mean_cosine"]


def describe(fig: dict[str, float], gate: QualityGate) -> str:
    """The figures next to their thresholds, for logs and errors."""
    if gate.metric == "top1":
        return (
            f"top-1 agreement {fig['top1_agreement']:.4f} (gate >= {gate.top1_agreement_min}), "
            f"max probability difference {fig['max_prob_diff']:.4f} "
            f"(gate <= {gate.max_prob_diff_max})"
        )
    return (
        f"mean cosine {fig['mean_cosine']:.4f} (gate {gate.mean_cosine_min}), min "
        f"{fig['min_cosine']:.4f} (gate {gate.min_cosine_min})"
    )


@dataclass
class Trial:
    excluded_groups: list[str]
    excluded_nodes: list[str]
    excluded_weights: int
    figures: dict[str, float]
    score: float
    passed: bool


@dataclass
class SearchResult:
    chosen: Trial
    trials: list[Trial] = field(default_factory=list)
    candidate_nodes: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "chosen": asdict(self.chosen),
            "candidate_nodes": self.candidate_nodes,
            "trials": [asdict(t) for t in self.trials],
        }


def search_exclusions(
    spec: ExportSpec,
    src: Path,
    dst: Path,
    work: Path,
    calibration: Sequence[Inputs],
    evaluation: Sequence[Inputs],
    reference: Sequence[np.ndarray],
    progress: Callable[[str], None] = print,
    target: str = CPU_TARGET,
) -> SearchResult:
    """Quantize everything by ``target``'s method; while the gate fails, greedily exclude (keep
    fp32) the group whose exclusion helps most (a passing candidate with the fewest excluded
    weights wins). Writes the chosen model to ``dst``; raises :class:`QualityGateError` with the
    best figures otherwise."""
    settings, gate = spec.quantization, spec.quality_gate
    assert gate is not None
    method = settings.method(target)
    cache = work / f"calibration_cache_{target}.json"
    nodes = weight_matmuls(src, settings.op_types)
    groups = {g: sorted(n for n in nodes if re.search(g, n)) for g in settings.sensitivity_groups}
    groups = {g: members for g, members in groups.items() if members}
    trials: list[Trial] = []

    def trial(excluded_groups: list[str], out: Path) -> Trial:
        excl = sorted({n for g in excluded_groups for n in groups[g]})
        quantize_int8(src, out, settings, calibration, cache, excl, target)
        fig = gate_figures(ort_runner(out), evaluation, reference, gate)
        t = Trial(
            excluded_groups=excluded_groups,
            excluded_nodes=excl,
            excluded_weights=sum(nodes[n] for n in excl),
            figures=fig,
            score=score(fig, gate),
            passed=passes(fig, gate),
        )
        trials.append(t)
        progress(
            f"int8 {method} excluding {excluded_groups or 'nothing'}: {describe(fig, gate)} -> "
            f"{'pass' if t.passed else 'fail'}"
        )
        return t

    best = trial([g for g in settings.kept_fp32(target) if g in groups], dst)
    best_path = dst
    rounds = 0
    while not best.passed and rounds < settings.max_search_rounds:
        rounds += 1
        options = []
        for i, g in enumerate(g for g in groups if g not in best.excluded_groups):
            out = work / f"trial_{target}_r{rounds}_{i}.onnx"
            options.append((trial([*best.excluded_groups, g], out), out))
        if not options:
            break
        passing = [o for o in options if o[0].passed]
        if passing:
            cand, path = min(passing, key=lambda o: (o[0].excluded_weights, -o[0].score))
        else:
            cand, path = max(options, key=lambda o: o[0].score)
            if cand.score <= best.score:
                break
        best, best_path = cand, path
    if not best.passed:
        raise QualityGateError(
            [
                f"best int8 {method} setting (excluding {best.excluded_groups or 'nothing'}): "
                f"{describe(best.figures, gate)} after {len(trials)} trials",
                "relax the spec's quality_gate, add sensitivity_groups, or skip --quantize",
            ]
        )
    if best_path != dst:
        best_path.replace(dst)
    return SearchResult(chosen=best, trials=trials, candidate_nodes=len(nodes))
