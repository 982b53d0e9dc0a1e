"""int8 steps of an encoder's export (:mod:`export.encoder`): the CPU graph (sensitivity
search, audit, quality gate, speed) and each other target's own graph beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tritonforge.export import onnx_checks, parity
from tritonforge.export.flow import Steps
from tritonforge.export.spec import CPU_TARGET, ExportSpec, Inputs
from tritonforge.export.staging import Staging

# int8 calibration batches, held-out batches and fp32's outputs on them (computed once per export)
Corpora = tuple[list[Inputs], list[Inputs], list[np.ndarray]]


def int8_on_cpu(
    spec: ExportSpec,
    version: int,
    staging: Staging,
    steps: Steps,
    report: dict[str, Any],
    raw: Path,
    fp32_deployed: Path,
    bench: Inputs,
    cases: list[parity.Case],
) -> tuple[list[str], Corpora]:
    """Quantize (with the sensitivity search), audit, gate; returns the audit problems
    and the corpora with fp32's reference outputs (reused by the other targets)."""
    import onnx

    from tritonforge.export.quantize import audit_int8, cosines, search_exclusions

    serving, gate = spec.serving, spec.quality_gate
    assert serving is not None and gate is not None and spec.calibration and spec.evaluation
    target = staging.version_dir(str(serving.int8_name), version) / "model.onnx"
    with steps("int8 calibration corpus + held-out evaluation set"):
        calibration = spec.calibration()
        evaluation = spec.evaluation()
        fp32 = parity.ort_runner(raw)
        ref = [fp32(b)[gate.output] for b in evaluation]
    method = spec.quantization.method(CPU_TARGET)
    with steps(f"int8 {method} quantization + quality gate (greedy sensitivity search)"):
        result = search_exclusions(
            spec, raw, target, staging.root / ".work", calibration, evaluation, ref, steps.note
        )
    with steps("int8 audit (every scale and zero point) + graph checks"):
        problems, counts = audit_int8(onnx.load(str(target)))
        report["graph_checks"]["int8"] = onnx_checks.check_graph(target, spec)
        steps.note(f"{counts}, {len(problems)} problem(s)")
    with steps("int8 speed vs fp32 + grid cosine"):
        int8 = parity.ort_runner(target)
        lat = parity.median_latency_ms(
            {"int8": int8, "fp32": fp32, "opt": parity.ort_runner(fp32_deployed)}, bench
        )
        t8, t32, t_opt = lat["int8"], lat["fp32"], lat["opt"]
        grid_cos = [
            float(cosines(int8(c.inputs)[gate.output], c.expected[gate.output]).min())
            for c in cases
        ]
        steps.note(
            f"int8 {t8:.1f} ms vs fp32 {t32:.1f} ms ({t32 / t8:.2f}x), vs optimised fp32 "
            f"{t_opt:.1f} ms ({t_opt / t8:.2f}x); grid min cosine vs PyTorch {min(grid_cos):.4f}"
        )
    report["quantization"] = _cpu_record(
        spec,
        len(calibration),
        result.as_dict(),
        result.chosen.figures,
        counts,
        problems,
        {"int8": t8, "fp32": t32, "fp32_optimized": t_opt},
        min(grid_cos),
    )
    return problems, (calibration, evaluation, ref)


def int8_for_target(
    spec: ExportSpec,
    version: int,
    staging: Staging,
    steps: Steps,
    report: dict[str, Any],
    raw: Path,
    target: str,
    corpora: Corpora,
) -> tuple[Path, list[str]]:
    """``target``'s own int8 graph beside the CPU's (the CPU's corpora and fp32 reference, its
    own search, audit and gate, on CPU with onnxruntime); returns its path and audit problems."""
    import onnx

    from tritonforge.export.quantize import audit_int8, search_exclusions

    serving, gate, q = spec.serving, spec.quality_gate, spec.quantization
    assert serving is not None and gate is not None and spec.calibration and spec.evaluation
    method = q.method(target)
    path = staging.version_dir(str(serving.int8_name), version) / q.artifact_name(target)
    with steps(f"int8 for {target} hosts: {method} quantization + quality gate (on CPU)"):
        calibration, evaluation, ref = corpora
        result = search_exclusions(
            spec,
            raw,
            path,
            staging.root / ".work",
            calibration,
            evaluation,
            ref,
            steps.note,
            target=target,
        )
    with steps(f"int8 for {target} hosts: audit + graph checks"):
        problems, counts = audit_int8(onnx.load(str(path)))
        report["graph_checks"][f"int8_{target}"] = onnx_checks.check_graph(path, spec)
        steps.note(f"{counts}, {len(problems)} problem(s)")
    report.setdefault("quantization_targets", {})[target] = {
        "file": path.name,
        "method": method,
        "calibration_source": spec.calibration_source,
        "calibration_batches": len(calibration),
        "evaluation_source": spec.evaluation_source,
        "settings": {
            "per_channel": q.per_channel,
            "activation_type": q.activation_type,
            "weight_type": q.weight_type,
            "symmetric": q.symmetric,
            "calibrate_method": q.calibrate_method,
            "op_types": list(q.op_types),
            "weights_only": q.weights_only,
        },
        "gate": {"metric": gate.metric, **gate.thresholds()},
        "quality": result.chosen.figures,
        "search": result.as_dict(),
        "audit": {"counts": counts, "problems": problems},
    }
    return path, problems


def _cpu_record(
    spec: ExportSpec,
    calibration_batches: int,
    search: dict[str, Any],
    quality: dict[str, float],
    counts: Any,
    problems: list[str],
    latency_ms: dict[str, float],
    grid_min_cosine: float,
) -> dict[str, Any]:
    """The report's ``quantization`` section for the CPU's int8 graph."""
    gate, q = spec.quality_gate, spec.quantization
    assert gate is not None
    t8, t32, t_opt = latency_ms["int8"], latency_ms["fp32"], latency_ms["fp32_optimized"]
    return {
        "calibration_source": spec.calibration_source,
        "calibration_batches": calibration_batches,
        "evaluation_source": spec.evaluation_source,
        "settings": {
            "method": q.method(CPU_TARGET),
            "per_channel": q.per_channel,
            "activation_type": q.activation_type,
            "weight_type": q.weight_type,
            "op_types": list(q.op_types),
            "weights_only": q.weights_only,
        },
        "gate": {"metric": gate.metric, **gate.thresholds()},
        "quality": quality,
        "search": search,
        "audit": {"counts": counts, "problems": problems},
        "latency_ms": {k: round(v, 2) for k, v in latency_ms.items()},
        "speedup_vs_fp32": t32 / t8,
        "speedup_vs_optimized": t_opt / t8,
        "grid_min_cosine_vs_pytorch": grid_min_cosine,
    }
