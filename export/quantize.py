"""int8 quantization (dynamic, or static QDQ with calibration), the cosine gate and the greedy sensitivity search that finds which weight groups
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
