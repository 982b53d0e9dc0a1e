"""An encoder's export (one forward pass per request), plugged into :mod:`export.flow`:
build -> ONNX -> graph checks -> parity on the shape grid -> optimise -> int8 (search, audit,
gate) -> TorchScript -> configs cross-checked against the graphs.

Every verification failure is collected; if there is any, one :class:`VerificationError`
(or :class:`QuantAuditError`) lists them all and the model repository is left untouched.
"""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tritonforge.export import onnx_checks, parity
from tritonforge.export.encoder_int8 import Int8Steps
from tritonforge.export.errors import QuantAuditError, SpecError, VerificationError
from tritonforge.export.flow import (
    Outcome,
    Progress,
    Steps,
    Task,
    check,
    report_header,
    run_flow,
    seal,
)
from tritonforge.export.onnx_export import export_onnx
from tritonforge.export.pipeline_spec import PipelineSpec
from tritonforge.export.report import render_markdown
from tritonforge.export.spec import CPU_TARGET, GPU_TARGET, TARGETS, ExportSpec
from tritonforge.export.staging import Staging, fingerprint, library_versions
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
from tritonforge.modelconfig import pbtxt_to_dict

__all__ = ["FORMATS", "Options", "Outcome", "Progress", "export_pipeline", "run_export"]

FORMATS = ("onnx", "torchscript")


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
    ``progress`` a terminal also gets a bar with an ETA (:mod:`export.step_bar`)."""
    task = Task(
        name=spec.name,
        planned=planned_artifacts(spec, options),
        fingerprint=partial(fingerprint, spec, options.as_dict()),
        build=partial(_build, spec, options),
    )
    return run_flow(task, options.repo, options.force, progress, bar=progress is print)


def _build(
    spec: ExportSpec, options: Options, staging: Staging, steps: Steps, fp: dict[str, Any]
) -> dict[str, Any]:
    return _EncoderBuild(spec, options, staging, steps, fp).run()


class _EncoderBuild:
    """The encoder's steps over one staging; ``failures`` collects every verification failure."""

    def __init__(
        self, spec: ExportSpec, options: Options, staging: Staging, steps: Steps, fp: dict[str, Any]
    ) -> None:
        assert spec.serving is not None
        self.spec, self.options, self.staging, self.steps = spec, options, staging, steps
        self.serving = spec.serving
        self.work = staging.root / ".work"
        self.work.mkdir()
        self.failures: list[str] = []
        self.audit_problems: list[str] = []
        self.report: dict[str, Any] = {
            **report_header(spec.name, spec.description, fp, library_versions(), spec.opset),
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
        self.bench = spec.example_inputs(spec.benchmark_lengths, np.random.default_rng(7))
        self.staged: dict[str, tuple[Path, ArtifactIO, str]] = {}  # model -> (file, io, backend)
        self.gpu_int8: Path | None = None  # the GPU target's own int8 graph, when exported
        self.cases: list[parity.Case] = []

    def run(self) -> dict[str, Any]:
        spec, formats, steps = self.spec, self.options.formats, self.steps
        with steps("build PyTorch module"):
            module = spec.build_module().eval()
            reference = parity.torch_runner(module, spec)
        raw = self.work / "raw.onnx"
        if "onnx" in formats:
            self._onnx_export(module, raw)
        with steps("PyTorch reference outputs on the shape grid"):
            self.cases, eager_failures = parity.build_cases(spec, reference)
            pad = parity.padding_failures(spec, reference, self.cases)
            self.failures += eager_failures + pad
            self.report["padding_invariance_failures"] = pad
        if "onnx" in formats:
            self._onnx_variants(raw)
        if "torchscript" in formats:
            self._torchscript(module)
        self._configs()
        for src, rel in spec.extra_files:
            shutil.copyfile(src, self.staging.path(rel))
        check(
            self.failures, spec.name, QuantAuditError if self.audit_problems else VerificationError
        )
        with steps("sha256 sidecars + reports"):
            files = {model: path for model, (path, _, _) in self.staged.items()}
            if self.gpu_int8 is not None:
                files[f"{self.serving.int8_name} ({GPU_TARGET})"] = self.gpu_int8
            dirs = [path.parent for path, _, _ in self.staged.values()]
            seal(self.staging, steps, self.report, files, dirs, render_markdown)
        return self.report

    def _grid(self, label: str, runner: parity.Runner) -> None:
        result = parity.check_grid(self.spec, label, runner, self.cases)
        self.report["parity"][label] = result.summary()
        self.failures.extend(result.failures)
        worst = result.worst
        if worst:
            self.steps.note(
                f"{label}: max abs {result.summary()['max_abs']:.3g}, worst {worst.label} "
                f"(ratio to tolerance {worst.worst_ratio:.3f}), {len(result.failures)} failure(s)"
            )

    def _graph_checks(self, key: str, path: Path) -> list[str]:
        problems = onnx_checks.check_graph(path, self.spec)
        self.report["graph_checks"][key] = problems
        self.failures += problems
        return problems

    def _onnx_export(self, module: torch.nn.Module, raw: Path) -> None:
        with self.steps("ONNX export"):
            export_onnx(module, self.spec, raw)
        with self.steps("ONNX graph checks (checker, shape inference, dynamic axes)"):
            problems = self._graph_checks("fp32", raw)
        if problems:  # no point running a broken graph
            raise VerificationError(self.failures, f"spec {self.spec.name}")

    def _onnx_variants(self, raw: Path) -> None:
        """fp32 (optimised when the spec says so) and int8 for every target, verified."""
        with self.steps("ONNX Runtime vs PyTorch on the grid"):
            self._grid("fp32", parity.ort_runner(raw))
        deployed = raw if self.spec.optimization is None else self._optimize(raw)
        self._task_metrics("fp32", deployed, "task metrics of fp32 (held-out set)")
        fp32_name = self.serving.fp32_name
        target = self.staging.version_dir(fp32_name, self.options.version) / "model.onnx"
        shutil.copyfile(deployed, target)
        self.staged[fp32_name] = (target, onnx_io(target), "onnxruntime")
        if self.options.quantize == "int8":
            self._int8(raw, deployed)

    def _optimize(self, raw: Path) -> Path:
        from tritonforge.export.optimize import optimize_graph

        assert self.spec.optimization is not None
        opt = self.work / "optimized.onnx"
        with self.steps("graph optimisation (onnxruntime.transformers)"):
            fused = optimize_graph(raw, opt, self.spec.optimization)
            self._graph_checks("fp32_optimized", opt)
            self.steps.note(f"fused operators: {fused}")
        with self.steps("optimised graph vs PyTorch on the grid"):
            self._grid("fp32_optimized", parity.ort_runner(opt))
            lat = parity.median_latency_ms(
                {"raw": parity.ort_runner(raw), "opt": parity.ort_runner(opt)}, self.bench
            )
            t_raw, t_opt = lat["raw"], lat["opt"]
            self.report["optimization"] = {
                "fused": fused,
                "latency_ms": {"fp32": round(t_raw, 2), "fp32_optimized": round(t_opt, 2)},
                "speedup": t_raw / t_opt,
                "benchmark_rows": len(self.spec.benchmark_lengths),
            }
            self.steps.note(
                f"optimised speed-up {t_raw / t_opt:.2f}x ({t_raw:.1f} -> {t_opt:.1f} ms)"
            )
        return opt

    def _task_metrics(self, variant: str, path: Path, step: str, label: str = "") -> None:
        if self.spec.task_metrics is None:
            return
        with self.steps(step):
            figures = self.spec.task_metrics(parity.ort_runner(path))
            self.report.setdefault("task_metrics", {})[variant] = figures
            self.steps.note(f"{label or variant}: {figures}")

    def _int8(self, raw: Path, deployed: Path) -> None:
        spec, options, report = self.spec, self.options, self.report
        int8_name = str(self.serving.int8_name)
        int8 = Int8Steps(spec, options.version, self.staging, self.steps, report, raw)
        problems, corpora = int8.on_cpu(deployed, self.bench, self.cases)
        self.audit_problems += problems
        self.failures += problems + report["graph_checks"].get("int8", [])
        target8 = self.staging.version_dir(int8_name, options.version) / "model.onnx"
        self._task_metrics("int8", target8, "task metrics of int8 (held-out set)")
        self.staged[int8_name] = (target8, onnx_io(target8), "onnxruntime")
        for host in int8_targets(spec, options):
            host_file, host_problems = int8.for_target(host, corpora)
            self._task_metrics(
                f"int8_{host}",
                host_file,
                f"task metrics of int8 for {host} hosts (on CPU, held-out set)",
                f"int8 ({host})",
            )
            self.audit_problems += host_problems
            self.failures += host_problems + report["graph_checks"].get(f"int8_{host}", [])
            if host == GPU_TARGET:
                self.gpu_int8 = host_file

    def _torchscript(self, module: torch.nn.Module) -> None:
        from tritonforge.export.torchscript import export_torchscript, torchscript_runner

        name = str(self.serving.torchscript_name)
        pt = self.staging.version_dir(name, self.options.version) / "model.pt"
        with self.steps("TorchScript trace + save"):
            export_torchscript(module, self.spec, pt)
        with self.steps("TorchScript (reloaded from disk) vs PyTorch on the grid"):
            self._grid("torchscript", torchscript_runner(pt, self.spec))
        self.staged[name] = (pt, torchscript_io(self.spec), "pytorch")

    def _configs(self) -> None:
        spec = self.spec
        with self.steps(
            "config.pbtxt + configs/gpu.pbtxt (derived from the graphs, cross-checked)"
        ):
            warmup = spec.warmup() if spec.warmup else None
            for model, (path, io, backend) in self.staged.items():
                for rel, gpu in (("config.pbtxt", False), (str(GPU_CONFIG), True)):
                    self._config(model, path, io, backend, rel, gpu, warmup)
                if warmup is not None:
                    rename = (
                        torchscript_names(spec)
                        if backend == "pytorch"
                        else {t.name: t.name for t in spec.inputs}
                    )
                    write_warmup_files(warmup, self.staging.root / model / "warmup", rename)

    def _config(
        self, model: str, path: Path, io: ArtifactIO, backend: str, rel: str, gpu: bool, warmup: Any
    ) -> None:
        """One config of ``model`` rendered, cross-checked against its graph and staged."""
        artifact, artifact_io = path, io
        quantized = model == self.serving.int8_name
        if gpu and quantized and self.gpu_int8 is not None:
            artifact, artifact_io = self.gpu_int8, onnx_io(self.gpu_int8)
        config = build_config(
            model,
            backend,
            artifact.name,
            artifact_io,
            self.spec,
            warmup,
            gpu=gpu,
            quantized=quantized,
            int8_method=self.spec.quantization.method(
                GPU_TARGET if artifact == self.gpu_int8 else CPU_TARGET
            ),
        )
        text = render_pbtxt(config)
        problems = cross_check(pbtxt_to_dict(text), artifact_io, f"{model}/{rel}")
        self.failures += problems
        self.staging.path(f"{model}/{rel}").write_text(text)
        self.report["configs"][f"{model}/{rel}"] = problems
