"""Numerical parity of an exported artifact against PyTorch eager on a grid of shapes."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tritonforge.export.spec import ExportSpec, Inputs, TensorDecl

Runner = Callable[[Inputs], dict[str, np.ndarray]]


@dataclass
class Case:
    """One grid point: inputs and PyTorch's outputs for them."""

    label: str
    lengths: tuple[int, ...]
    inputs: Inputs
    expected: dict[str, np.ndarray]


@dataclass
class CaseError:
    label: str
    output: str
    max_abs: float
    max_rel: float
    violations: int  # elements outside atol + rtol * |expected|
    worst_ratio: float  # max |err| / (atol + rtol * |expected|); <= 1 passes


@dataclass
class GridResult:
    artifact: str
    cases: list[CaseError] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def worst(self) -> CaseError | None:
        return max(self.cases, key=lambda c: c.worst_ratio, default=None)

    def summary(self) -> dict[str, Any]:
        worst = self.worst
        return {
            "artifact": self.artifact,
            "shapes": len({c.label for c in self.cases}),
            "max_abs": max((c.max_abs for c in self.cases), default=0.0),
            "max_rel": max((c.max_rel for c in self.cases), default=0.0),
            "worst": asdict(worst) if worst else None,
            "failures": self.failures,
            "cases": [asdict(c) for c in self.cases],
        }


def torch_runner(module: torch.nn.Module, spec: ExportSpec) -> Runner:
    names = [t.name for t in spec.inputs]
    out_names = [t.name for t in spec.outputs]

    def run(inputs: Inputs) -> dict[str, np.ndarray]:
        with torch.inference_mode():
            result = module(*(torch.from_numpy(inputs[n]) for n in names))
        if isinstance(result, torch.Tensor):
            result = (result,)
        return {n: t.numpy() for n, t in zip(out_names, result, strict=True)}

    return run


def ort_runner(path: Path, threads: int = 0) -> Runner:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    graph_inputs = {i.name for i in session.get_inputs()}
    out_names = [o.name for o in session.get_outputs()]

    def run(inputs: Inputs) -> dict[str, np.ndarray]:
        feed = {k: v for k, v in inputs.items() if k in graph_inputs}
        return dict(zip(out_names, session.run(out_names, feed), strict=True))

    return run


def build_cases(spec: ExportSpec, reference: Runner, seed: int = 0) -> tuple[list[Case], list[str]]:
    """Grid shapes (full rows) and padded mixed-length batches, with PyTorch's outputs.

    Returns ``(cases, failures)``: a shape PyTorch itself cannot run is a failure, not a case.
    """
    rng = np.random.default_rng(seed)
    shapes: list[tuple[str, tuple[int, ...]]] = [
        (f"batch={b} seq={s}", (s,) * b) for b, s in spec.grid
    ]
    shapes += [
        (f"padded batch={len(ls)} lengths={min(ls)}..{max(ls)}", tuple(ls))
        for ls in spec.mixed_batches
    ]
    cases, failures = [], []
    for label, lengths in shapes:
        inputs = spec.example_inputs(lengths, rng)
        try:
            cases.append(Case(label, lengths, inputs, reference(inputs)))
        except Exception as e:
            failures.append(f"PyTorch eager {label}: {type(e).__name__}: {e}"[:500])
    return cases, failures


def compare(
    spec: ExportSpec, label: str, got: dict[str, np.ndarray], want: dict[str, np.ndarray]
) -> tuple[list[CaseError], list[str]]:
    return compare_outputs(spec.outputs, label, got, want)


def compare_outputs(
    outputs: Sequence[TensorDecl],
    label: str,
    got: dict[str, np.ndarray],
    want: dict[str, np.ndarray],
) -> tuple[list[CaseError], list[str]]:
    """Each declared output of ``got`` against ``want`` within its ``atol + rtol * |want|``:
    ``(errors per output, failures)``."""
    errors, failures = [], []
    for decl in outputs:
        if decl.name not in got:
            failures.append(f"{label}: output {decl.name!r} missing")
            continue
        a = np.asarray(got[decl.name], dtype=np.float64)
        b = np.asarray(want[decl.name], dtype=np.float64)
        if a.shape != b.shape:
            failures.append(f"{label}: output {decl.name!r} shape {a.shape}, expected {b.shape}")
            continue
        diff = np.abs(a - b)
        if not np.all(np.isfinite(a)):
            failures.append(f"{label}: output {decl.name!r} has non-finite values")
            continue
        bound = decl.atol + decl.rtol * np.abs(b)
        rel = diff / np.maximum(np.abs(b), 1e-6)
        err = CaseError(
            label=label,
            output=decl.name,
            max_abs=float(diff.max(initial=0.0)),
            max_rel=float(rel.max(initial=0.0)),
            violations=int(np.count_nonzero(diff > bound)),
            worst_ratio=float((diff / np.maximum(bound, 1e-30)).max(initial=0.0)),
        )
        errors.append(err)
        if err.violations:
            failures.append(
                f"{label}: output {decl.name!r} max abs {err.max_abs:.3g} / max rel "
                f"{err.max_rel:.3g} exceed atol {decl.atol:g} + rtol {decl.rtol:g} "
                f"({err.violations} element(s))"
            )
    return errors, failures


def check_grid(
    spec: ExportSpec, artifact: str, runner: Runner, cases: Sequence[Case]
) -> GridResult:
    """Run ``runner`` on every case; each failure (exception or tolerance) is collected."""
    result = GridResult(artifact)
    for case in cases:
        try:
            got = runner(case.inputs)
        except Exception as e:
            result.failures.append(f"{artifact} {case.label}: {type(e).__name__}: {e}"[:500])
            continue
        errors, failures = compare(spec, case.label, got, case.expected)
        result.cases += errors
        result.failures += [f"{artifact} {f}" for f in failures]
    return result


def padding_failures(spec: ExportSpec, reference: Runner, cases: Sequence[Case]) -> list[str]:
    """Padded rows must equal each row run alone (pooling and masking are exact)."""
    failures = []
    for case in cases:
        if len(set(case.lengths)) < 2:
            continue
        for row, n in enumerate(case.lengths):
            single = {k: v[row : row + 1, :n] for k, v in case.inputs.items()}
            alone = reference(single)
            padded = {k: v[row : row + 1] for k, v in case.expected.items()}
            _, problems = compare(spec, f"{case.label} row {row} (padded vs alone)", alone, padded)
            failures += problems
    return failures


def median_latency_ms(
    runners: dict[str, Runner], inputs: Inputs, repeats: int = 12, warmup: int = 2
) -> dict[str, float]:
    """Median latency of each runner on ``inputs``, runs interleaved (A B C A B C ...) so that
    load from other processes on a shared machine hits every runner alike."""
    for runner in runners.values():
        for _ in range(warmup):
            runner(inputs)
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeats):
        for name, runner in runners.items():
            t0 = time.perf_counter()
            runner(inputs)
            times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}
