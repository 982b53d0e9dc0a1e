"""int8 steps of an encoder's export (:mod:`export.encoder`): the CPU graph (sensitivity
search, audit, quality gate, speed) and each other target's own graph beside it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tritonforge.export import onnx_checks, parity
from tritonforge.export.flow import Steps
from tritonforge.export.spec import CPU_TARGET, ExportSpec, Inputs
from tritonforge.export.staging import Staging

# int8 calibration batches, held-out batches and fp32's outputs on them (computed once per export)
Corpora = tuple[list[Inputs], list[Inputs], list[np.ndarray]]


@dataclass
class Int8Steps:
    """The int8 graphs of ``spec`` quantized from ``raw`` (fp32) into ``staging``; each records
    its figures in ``report``."""

    spec: ExportSpec
    version: int
    staging: Staging
    steps: Steps
    report: dict[str, Any]
    raw: Path

    def path(self, target: str) -> Path:
        serving = self.spec.serving
        assert serving is not None
        name = (
            self.spec.quantization.artifact_name(target) if target != CPU_TARGET else "model.onnx"
        )
        return self.staging.version_dir(str(serving.int8_name), self.version) / name

    def on_cpu(
        self, fp32_deployed: Path, bench: Inputs, cases: list[parity.Case]
    ) -> tuple[list[str], Corpora]:
        """Quantize (with the sensitivity search), audit, gate; returns the audit problems
        and the corpora with fp32's reference outputs (reused by the other targets)."""
        from tritonforge.export.quantize import cosines

        spec, steps, gate = self.spec, self.steps, self.spec.quality_gate
        assert gate is not None and spec.calibration and spec.evaluation
        with steps("int8 calibration corpus + held-out evaluation set"):
            calibration = spec.calibration()
            evaluation = spec.evaluation()
            fp32 = parity.ort_runner(self.raw)
            ref = [fp32(b)[gate.output] for b in evaluation]
        target = self.path(CPU_TARGET)
        method = spec.quantization.method(CPU_TARGET)
        result, problems, counts = self._quantize_and_audit(
            CPU_TARGET,
            (calibration, evaluation, ref),
            f"int8 {method} quantization + quality gate (greedy sensitivity search)",
            "int8 audit (every scale and zero point) + graph checks",
            "int8",
        )
        with steps("int8 speed vs fp32 + grid cosine"):
            int8 = parity.ort_runner(target)
            runners = {"int8": int8, "fp32": fp32, "opt": parity.ort_runner(fp32_deployed)}
            lat = parity.median_latency_ms(runners, bench)
            t8, t32, t_opt = lat["int8"], lat["fp32"], lat["opt"]
            grid_cos = [
                float(cosines(int8(c.inputs)[gate.output], c.expected[gate.output]).min())
                for c in cases
            ]
            steps.note(
                f"int8 {t8:.1f} ms vs fp32 {t32:.1f} ms ({t32 / t8:.2f}x), vs optimised fp32 "
                f"{t_opt:.1f} ms ({t_opt / t8:.2f}x); grid min cosine vs PyTorch "
                f"{min(grid_cos):.4f}"
            )
        latency_ms = {"int8": t8, "fp32": t32, "fp32_optimized": t_opt}
        self.report["quantization"] = _cpu_record(
            spec, len(calibration), result, (counts, problems), latency_ms, min(grid_cos)
        )
        return problems, (calibration, evaluation, ref)

    def for_target(self, target: str, corpora: Corpora) -> tuple[Path, list[str]]:
        """``target``'s own int8 graph beside the CPU's (the CPU's corpora and fp32 reference,
        its own search, audit and gate, on CPU with onnxruntime); returns its path and audit
        problems."""
        spec, q, gate = self.spec, self.spec.quantization, self.spec.quality_gate
        assert gate is not None
        method = q.method(target)
        result, problems, counts = self._quantize_and_audit(
            target,
            corpora,
            f"int8 for {target} hosts: {method} quantization + quality gate (on CPU)",
            f"int8 for {target} hosts: audit + graph checks",
            f"int8_{target}",
        )
        path = self.path(target)
        self.report.setdefault("quantization_targets", {})[target] = {
            "file": path.name,
            "method": method,
            "calibration_source": spec.calibration_source,
            "calibration_batches": len(corpora[0]),
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

    def _quantize_and_audit(
        self, target: str, corpora: Corpora, search_step: str, audit_step: str, key: str
    ) -> tuple[Any, list[str], Any]:
        """The sensitivity search (quantize + gate) for ``target``, then the audit of every scale
        and zero point and the graph checks (under ``graph_checks[key]``)."""
        import onnx

        from tritonforge.export.int8_audit import audit_int8
        from tritonforge.export.quantize import search_exclusions

        path, work = self.path(target), self.staging.root / ".work"
        calibration, evaluation, ref = corpora
        with self.steps(search_step):
            result = search_exclusions(
                self.spec,
                self.raw,
                path,
                work,
                calibration,
                evaluation,
                ref,
                self.steps.note,
                target=target,
            )
        with self.steps(audit_step):
            problems, counts = audit_int8(onnx.load(str(path)))
            self.report["graph_checks"][key] = onnx_checks.check_graph(path, self.spec)
            self.steps.note(f"{counts}, {len(problems)} problem(s)")
        return result, problems, counts


def _cpu_record(
    spec: ExportSpec,
    calibration_batches: int,
    result: Any,
    audit: tuple[Any, list[str]],
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
        "quality": result.chosen.figures,
        "search": result.as_dict(),
        "audit": {"counts": audit[0], "problems": audit[1]},
        "latency_ms": {k: round(v, 2) for k, v in latency_ms.items()},
        "speedup_vs_fp32": t32 / t8,
        "speedup_vs_optimized": t_opt / t8,
        "grid_min_cosine_vs_pytorch": grid_min_cosine,
    }
