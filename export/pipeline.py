"""The export pipeline: build -> export -> verify everything -> write atomically.

Every verification failure is collected; if there is any, one :class:`VerificationError`
(or :class:`QuantAuditError`) lists them all and the model repository is left untouched.
"""

from __future__ import annotations

import dataclasses
import datetime
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tritonforge.export import onnx_checks, parity
from tritonforge.export.errors import QuantAuditError, SpecError, VerificationError
from tritonforge.export.onnx_export import export_onnx
from tritonforge.export.pipeline_spec import PipelineSpec
from tritonforge.export.progress import StepBar, previous_timings
from tritonforge.export.report import write_report
from tritonforge.export.repository import (
    Staging,
    fingerprint,
    library_versions,
    up_to_date,
)
from tritonforge.export.spec import CPU_TARGET, GPU_TARGET, TARGETS, ExportSpec, Inputs
from tritonforge.export.tritonconfig import (
    GPU_CONFIG,
    ArtifactIO,
    build_config,
    cross_check,
    onnx_io,
    render_pbtxt,
    torchscript_io,
    torchscript_names,
    write_warmup_files,
)
from tritonforge.integrity import sha256_file
from tritonforge.modelconfig import pbtxt_to_dict

FORMATS = ("onnx", "torchscript")
# int8 calibration batches, held-out batches and fp32's outputs on them (computed once per export)
Corpora = tuple[list[Inputs], list[Inputs], list[np.ndarray]]
Progress = Callable[[str], None]


@dataclass
class Options:
    repo: Path
    formats: tuple[str, ...] = FORMATS
    quantize: str | None = None
    version: int = 1
    force: bool = False
    # Deployment targets whose int8 graph is built (when their method differs from the CPU's).
    # Not fingerprinted: the spec and code decide every artifact's content, the targets only
    # which artifacts must exist, so a CPU export after a GPU one skips and keeps the QDQ graph.
    targets: tuple[str, ...] = (CPU_TARGET,)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.targets) - set(TARGETS))
        if unknown or CPU_TARGET not in self.targets:
            raise SpecError(
                f"export targets {list(self.targets)}: choose from {TARGETS}, cpu included"
            )

    def as_dict(self) -> dict[str, Any]:
        return {
            "formats": sorted(self.formats),
            "quantize": self.quantize,
            "version": self.version,
        }


def int8_targets(spec: ExportSpec, options: Options) -> tuple[str, ...]:
    """The non-CPU targets of ``options`` that get an int8 graph of their own."""
    if options.quantize != "int8" or "onnx" not in options.formats:
        return ()
    return tuple(t for t in spec.quantization.own_targets() if t in options.targets)


@dataclass
class Outcome:
    skipped: bool
    report: dict[str, Any] = field(default_factory=dict)
    moved: list[str] = field(default_factory=list)
    generated: list[str] = field(default_factory=list)


class _Steps:
    """Numbered progress lines with per-step timings."""

    def __init__(self, spec: str, progress: Progress, bar: StepBar | None = None) -> None:
        self.spec, self.progress, self.bar = spec, progress, bar
        self.timings: dict[str, float] = {}
        self.t0 = time.perf_counter()

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self.progress(f"==> [export {self.spec}] {name} ...")
        t = time.perf_counter()
        yield
        self.timings[name] = time.perf_counter() - t
        self.progress(f"    {name}: {self.timings[name]:.1f} s")
        if self.bar is not None:
            self.bar.advance(name, self.timings[name])

    def note(self, text: str) -> None:
        self.progress(f"    {text}")


def planned_artifacts(spec: ExportSpec, options: Options) -> dict[str, str]:
    """Model name -> repo-relative artifact path this export writes (plus extra files)."""
    s = spec.serving
    if s is None:
        raise SpecError(f"spec {spec.name} has no serving section (model names)")
    v = options.version
    out: dict[str, str] = {}
    if "onnx" in options.formats:
        out[s.fp32_name] = f"{s.fp32_name}/{v}/model.onnx"
        if options.quantize == "int8":
            if not s.int8_name or spec.quality_gate is None or spec.calibration is None:
                raise SpecError(f"spec {spec.name} does not support int8 (names, gate, corpus)")
            out[s.int8_name] = f"{s.int8_name}/{v}/model.onnx"
            for target in int8_targets(spec, options):
                name = spec.quantization.artifact_name(target)
                out[f"{s.int8_name} ({target})"] = f"{s.int8_name}/{v}/{name}"
    if "torchscript" in options.formats:
        if not s.torchscript_name:
            raise SpecError(f"spec {spec.name} has no torchscript model name")
        out[s.torchscript_name] = f"{s.torchscript_name}/{v}/model.pt"
    for _, rel in spec.extra_files:
        out[rel] = rel
    return out


def export_pipeline(
    pipeline: PipelineSpec, options: Options, progress: Progress = print
) -> Outcome:
    """Export the pipeline's encoders (skipped when up to date), then generate every other config
    of the pipeline from its spec and the exported encoders' configs."""
    outcome = run_export(pipeline.encoder, options, progress)
    for extra in pipeline.extra_versions:
        more = run_export(
            extra.encoder, dataclasses.replace(options, version=extra.number), progress
        )
        outcome.moved += more.moved
        outcome.skipped = outcome.skipped and more.skipped
    from tritonforge.export.pipeline_configs import write_pipeline

    outcome.generated = write_pipeline(pipeline, options.repo)
    models = sorted({rel.split("/", 1)[0] for rel in outcome.generated})
    progress(
        f"==> [export {pipeline.encoder.name}] pipeline {pipeline.name!r} ({pipeline.task}): "
        + (f"generated {', '.join(models)}" if models else "configs up to date")
    )
    return outcome


def run_export(spec: ExportSpec, options: Options, progress: Progress = print) -> Outcome:
    """Export ``spec`` into ``options.repo``; skip when the inputs are unchanged. With the default
    ``progress`` a terminal also gets a bar with an ETA (:mod:`export.progress`)."""
    planned = planned_artifacts(spec, options)
    bar = None
    if progress is print:
        bar = StepBar(spec.name, previous_timings(options.repo, planned.values()))
        progress = bar.write
    try:
        return _run(spec, options, planned, _Steps(spec.name, progress, bar))
    finally:
        if bar is not None:
            bar.close()


def _run(spec: ExportSpec, options: Options, planned: dict[str, str], steps: _Steps) -> Outcome:
    progress = steps.progress
    with steps("fingerprint inputs"):
        fp = fingerprint(spec, options.as_dict())
    if not options.force:
        ok, reason = up_to_date(options.repo, planned.values(), fp["digest"])
        if ok:
            progress(f"==> [export {spec.name}] up to date ({reason}); nothing to do")
            return Outcome(skipped=True)
        steps.note(f"exporting: {reason}")
    staging = Staging(options.repo)
    try:
        report = _build(spec, options, staging, steps, fp)
        with steps("commit (os.replace into the repository)"):
            moved = staging.commit()
        progress(
            f"==> [export {spec.name}] done in {time.perf_counter() - steps.t0:.1f} s: "
            + ", ".join(sorted(planned))
        )
        return Outcome(skipped=False, report=report, moved=moved)
    finally:
        staging.discard()


def _build(
    spec: ExportSpec, options: Options, staging: Staging, steps: _Steps, fp: dict[str, Any]
) -> dict[str, Any]:
    serving = spec.serving
    assert serving is not None
    work = staging.root / ".work"
    work.mkdir()
    failures: list[str] = []
    audit_problems: list[str] = []
    report: dict[str, Any] = {
        "spec": spec.name,
        "description": spec.description,
        "created_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "fingerprint": fp,
        "libraries": library_versions(),
        "opset": spec.opset,
        "options": options.as_dict(),
        "grid": {
            "shapes": [list(s) for s in spec.grid],
            "mixed_batches": [list(m) for m in spec.mixed_batches],
        },
        "graph_checks": {},
        "parity": {},
        "artifacts": {},
        "configs": {},
    }
    bench = spec.example_inputs(spec.benchmark_lengths, np.random.default_rng(7))
    with steps("build PyTorch module"):
        module = spec.build_module().eval()
        reference = parity.torch_runner(module, spec)
    staged: dict[str, tuple[Path, ArtifactIO, str]] = {}  # model -> (file, io, backend)
    gpu_int8: Path | None = None  # the GPU target's own int8 graph, when exported

    def grid(label: str, runner: parity.Runner) -> None:
        result = parity.check_grid(spec, label, runner, cases)
        report["parity"][label] = result.summary()
        failures.extend(result.failures)
        worst = result.worst
        if worst:
            steps.note(
                f"{label}: max abs {result.summary()['max_abs']:.3g}, worst {worst.label} "
                f"(ratio to tolerance {worst.worst_ratio:.3f}), {len(result.failures)} failure(s)"
            )

    raw = work / "raw.onnx"
    if "onnx" in options.formats:
        with steps("ONNX export"):
            export_onnx(module, spec, raw)
        with steps("ONNX graph checks (checker, shape inference, dynamic axes)"):
            problems = onnx_checks.check_graph(raw, spec)
            report["graph_checks"]["fp32"] = problems
            failures += problems
        if problems:  # no point running a broken graph
            raise VerificationError(failures, f"spec {spec.name}")
    with steps("PyTorch reference outputs on the shape grid"):
        cases, eager_failures = parity.build_cases(spec, reference)
        pad = parity.padding_failures(spec, reference, cases)
        failures += eager_failures + pad
        report["padding_invariance_failures"] = pad
    if "onnx" in options.formats:
        with steps("ONNX Runtime vs PyTorch on the grid"):
            grid("fp32", parity.ort_runner(raw))
        deployed = raw
        if spec.optimization is not None:
            from tritonforge.export.optimize import optimize_graph

            opt = work / "optimized.onnx"
            with steps("graph optimisation (onnxruntime.transformers)"):
                fused = optimize_graph(raw, opt, spec.optimization)
                problems = onnx_checks.check_graph(opt, spec)
                report["graph_checks"]["fp32_optimized"] = problems
                failures += problems
                steps.note(f"fused operators: {fused}")
            with steps("optimised graph vs PyTorch on the grid"):
                grid("fp32_optimized", parity.ort_runner(opt))
                lat = parity.median_latency_ms(
                    {"raw": parity.ort_runner(raw), "opt": parity.ort_runner(opt)}, bench
                )
                t_raw, t_opt = lat["raw"], lat["opt"]
                report["optimization"] = {
                    "fused": fused,
                    "latency_ms": {"fp32": round(t_raw, 2), "fp32_optimized": round(t_opt, 2)},
                    "speedup": t_raw / t_opt,
                    "benchmark_rows": len(spec.benchmark_lengths),
                }
                steps.note(
                    f"optimised speed-up {t_raw / t_opt:.2f}x ({t_raw:.1f} -> {t_opt:.1f} ms)"
                )
            deployed = opt
        if spec.task_metrics is not None:
            with steps("task metrics of fp32 (held-out set)"):
                report.setdefault("task_metrics", {})["fp32"] = spec.task_metrics(
                    parity.ort_runner(deployed)
                )
                steps.note(f"fp32: {report['task_metrics']['fp32']}")
        target = staging.version_dir(serving.fp32_name, options.version) / "model.onnx"
        shutil.copyfile(deployed, target)
        staged[serving.fp32_name] = (target, onnx_io(target), "onnxruntime")

        if options.quantize == "int8":
            audit_problems, corpora = _int8(
                spec, options, staging, steps, report, raw, deployed, bench, cases
            )
            failures += audit_problems + report["graph_checks"].get("int8", [])
            target8 = staging.version_dir(str(serving.int8_name), options.version) / "model.onnx"
            if spec.task_metrics is not None:
                with steps("task metrics of int8 (held-out set)"):
                    report["task_metrics"]["int8"] = spec.task_metrics(parity.ort_runner(target8))
                    steps.note(f"int8: {report['task_metrics']['int8']}")
            staged[str(serving.int8_name)] = (target8, onnx_io(target8), "onnxruntime")
            for host in int8_targets(spec, options):
                host_file, host_problems = _int8_target(
                    spec, options, staging, steps, report, raw, host, corpora
                )
                audit_problems += host_problems
                failures += host_problems + report["graph_checks"].get(f"int8_{host}", [])
                if host == GPU_TARGET:
                    gpu_int8 = host_file

    if "torchscript" in options.formats:
        from tritonforge.export.torchscript import export_torchscript, torchscript_runner

        pt = staging.version_dir(str(serving.torchscript_name), options.version) / "model.pt"
        with steps("TorchScript trace + save"):
            export_torchscript(module, spec, pt)
        with steps("TorchScript (reloaded from disk) vs PyTorch on the grid"):
            grid("torchscript", torchscript_runner(pt, spec))
        staged[str(serving.torchscript_name)] = (pt, torchscript_io(spec), "pytorch")

    with steps("config.pbtxt + configs/gpu.pbtxt (derived from the graphs, cross-checked)"):
        warmup = spec.warmup() if spec.warmup else None
        for model, (path, io, backend) in staged.items():
            rename = (
                torchscript_names(spec)
                if backend == "pytorch"
                else {t.name: t.name for t in spec.inputs}
            )
            for rel, gpu in (("config.pbtxt", False), (str(GPU_CONFIG), True)):
                artifact, artifact_io = path, io
                quantized = model == serving.int8_name
                if gpu and quantized and gpu_int8 is not None:
                    artifact, artifact_io = gpu_int8, onnx_io(gpu_int8)
                config = build_config(
                    model,
                    backend,
                    artifact.name,
                    artifact_io,
                    spec,
                    warmup,
                    gpu=gpu,
                    quantized=quantized,
                    int8_method=spec.quantization.method(
                        GPU_TARGET if artifact == gpu_int8 else CPU_TARGET
                    ),
                )
                text = render_pbtxt(config)
                problems = cross_check(pbtxt_to_dict(text), artifact_io, f"{model}/{rel}")
                failures += problems
                staging.path(f"{model}/{rel}").write_text(text)
                report["configs"][f"{model}/{rel}"] = problems
            if warmup is not None:
                write_warmup_files(warmup, staging.root / model / "warmup", rename)

    for src, rel in spec.extra_files:
        shutil.copyfile(src, staging.path(rel))

    if failures:
        error = QuantAuditError if audit_problems else VerificationError
        raise error(failures, f"spec {spec.name}")

    with steps("sha256 sidecars + reports"):
        staging.seal()
        files = {model: path for model, (path, _, _) in staged.items()}
        if gpu_int8 is not None:
            files[f"{serving.int8_name} ({GPU_TARGET})"] = gpu_int8
        for model, path in files.items():
            report["artifacts"][model] = {
                "file": str(path.relative_to(staging.root)),
                "bytes": path.stat().st_size,
                "sha256": sha256_file(path),
            }
        steps.timings["total"] = time.perf_counter() - steps.t0
        report["timings_s"] = {k: round(v, 3) for k, v in steps.timings.items()}
        for _, (path, _, _) in staged.items():
            write_report(report, path.parent)
    return report


def _int8(
    spec: ExportSpec,
    options: Options,
    staging: Staging,
    steps: _Steps,
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
    target = staging.version_dir(str(serving.int8_name), options.version) / "model.onnx"
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
    report["quantization"] = {
        "calibration_source": spec.calibration_source,
        "calibration_batches": len(calibration),
        "evaluation_source": spec.evaluation_source,
        "settings": {
            "method": method,
            "per_channel": spec.quantization.per_channel,
            "activation_type": spec.quantization.activation_type,
            "weight_type": spec.quantization.weight_type,
            "op_types": list(spec.quantization.op_types),
            "weights_only": spec.quantization.weights_only,
        },
        "gate": {"metric": gate.metric, **gate.thresholds()},
        "quality": result.chosen.figures,
        "search": result.as_dict(),
        "audit": {"counts": counts, "problems": problems},
        "latency_ms": {
            "int8": round(t8, 2),
            "fp32": round(t32, 2),
            "fp32_optimized": round(t_opt, 2),
        },
        "speedup_vs_fp32": t32 / t8,
        "speedup_vs_optimized": t_opt / t8,
        "grid_min_cosine_vs_pytorch": min(grid_cos),
    }
    return problems, (calibration, evaluation, ref)


def _int8_target(
    spec: ExportSpec,
    options: Options,
    staging: Staging,
    steps: _Steps,
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
    path = staging.version_dir(str(serving.int8_name), options.version) / q.artifact_name(target)
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
    if spec.task_metrics is not None:
        with steps(f"task metrics of int8 for {target} hosts (on CPU, held-out set)"):
            figures = spec.task_metrics(parity.ort_runner(path))
            report.setdefault("task_metrics", {})[f"int8_{target}"] = figures
            steps.note(f"int8 ({target}): {figures}")
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
