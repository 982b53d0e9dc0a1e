"""CI gates (``make gate``): three checks that each pass, fail or skip, and a summary that names
what broke.

1. **model consistency**: served == PyTorch for every pipeline: the parity test files
   ``tests/integration/test_*parity*.py`` (every ensemble, BLS route and variant, HTTP and gRPC,
   against an in-process PyTorch reference). A new pipeline is gated by adding such a file.
2. **hardware**: :mod:`deploy.gpu_check` (GPU vs CPU parity of the exported encoders) where a GPU
   execution provider exists; otherwise the gate says it skipped and why.
3. **performance baseline**: bench throughput *ratios* (each cell over a reference cell measured
   in the same run, so machine speed cancels out) against the committed
   ``deploy/perf-baseline.json``, each allowed to fall by ``tolerance`` at most.

Bench JSON schema the perf gate relies on (``loadtest.bench`` writes it; either spelling works):
``{"cells": [{"label"|"target": str, "concurrency"|"conc": int,
"sentences_per_s"|"sent_s": float, ...}]}``; a cell is named ``"<label> @<concurrency>"``.
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tritonforge.deploy.errors import DeployError

log = logging.getLogger(__name__)
PROJECT_ROOT = Path(__file__).resolve().parent.parent
BASELINE = Path(__file__).resolve().parent / "perf-baseline.json"
PARITY_TESTS = "tests/integration/test_*parity*.py"
LABEL_KEYS = ("label", "target")
CONCURRENCY_KEYS = ("concurrency", "conc")
THROUGHPUT_KEYS = ("sentences_per_s", "sent_s")
PASS, FAIL, SKIP = "pass", "FAIL", "skip"


class GateError(DeployError):
    """A gate cannot run at all (missing or unreadable baseline/bench file)."""


@dataclass(frozen=True)
class GateResult:
    name: str
    status: str
    detail: str


# -- performance baseline --------------------------------------------------------------------------
def _first(record: Mapping[str, Any], keys: Sequence[str], what: str) -> Any:
    for key in keys:
        if key in record:
            return record[key]
    raise GateError(f"a bench cell has no {what} (looked for {', '.join(keys)}): {record}")


def cell_throughputs(report: Mapping[str, Any]) -> dict[str, float]:
    """``"<label> @<concurrency>"`` -> throughput, for every cell of a bench JSON report."""
    cells = report.get("cells")
    if not isinstance(cells, list) or not cells:
        raise GateError("the bench report has no 'cells' list (is it loadtest.bench's JSON?)")
    out: dict[str, float] = {}
    for record in cells:
        label = str(_first(record, LABEL_KEYS, "label"))
        conc = int(_first(record, CONCURRENCY_KEYS, "concurrency"))
        out[f"{label} @{conc}"] = float(_first(record, THROUGHPUT_KEYS, "throughput"))
    return out


def ratios(throughputs: Mapping[str, float], reference: str) -> dict[str, float]:
    """Each cell's throughput over the reference label's at the same concurrency."""
    out: dict[str, float] = {}
    for cell, value in throughputs.items():
        label, _, conc = cell.rpartition(" @")
        ref = throughputs.get(f"{reference} @{conc}")
        if label != reference and ref and not math.isnan(ref) and ref > 0:
            out[cell] = value / ref
    return out


def load_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise GateError(f"cannot read the {what} {path}: {e}") from e
    return data


def compare(baseline: Mapping[str, Any], report: Mapping[str, Any]) -> list[str]:
    """Findings (empty = pass): each baseline ratio that fell by more than the tolerance, or that
    the report does not measure."""
    reference = str(baseline["reference"])
    tolerance = float(baseline["tolerance"])
    current = ratios(cell_throughputs(report), reference)
    findings = []
    for cell, expected in sorted(baseline["ratios"].items()):
        got = current.get(cell)
        if got is None or math.isnan(got):
            findings.append(f"{cell}: not measured (or no '{reference}' cell at that concurrency)")
        elif got < expected * (1 - tolerance):
            findings.append(
                f"{cell}: {got:.2f}x {reference}, baseline {expected:.2f}x "
                f"(allowed down to {expected * (1 - tolerance):.2f}x)"
            )
    return findings


def baseline_from(report: Mapping[str, Any], reference: str, tolerance: float) -> dict[str, Any]:
    """A baseline document from a bench report (``--write-baseline``)."""
    current = ratios(cell_throughputs(report), reference)
    if not current:
        raise GateError(f"the bench report has no cell besides the reference {reference!r}")
    return {
        "reference": reference,
        "tolerance": tolerance,
        "ratios": {k: round(v, 3) for k, v in sorted(current.items())},
        "measured": {
            "machine": report.get("machine"),
            "load_average_at_end": report.get("load_average_at_end"),
        },
    }


def run_bench(baseline: Mapping[str, Any], repo: Path, reports_dir: Path) -> dict[str, Any]:
    """Run ``loadtest.bench`` with the baseline's ``bench_args``; its JSON report."""
    command = [
        sys.executable, "-m", "tritonforge.loadtest.bench", "--model-repository", str(repo),
        "--reports-dir", str(reports_dir), *baseline.get("bench_args", []),
    ]  # fmt: skip
    log.info("==> [gate] %s", " ".join(command))
    if subprocess.call(command, cwd=PROJECT_ROOT) != 0:
        raise GateError("loadtest.bench failed (see its output above)")
    reports = sorted(reports_dir.glob("bench-*.json"))
    if not reports:
        raise GateError(f"loadtest.bench wrote no bench-*.json into {reports_dir}")
    return load_json(reports[-1], "bench report")


def perf_gate(
    baseline_path: Path,
    repo: Path,
    bench_json: Path | None,
    reports_dir: Path = Path("reports/gate"),
) -> GateResult:
    """Bench ratios vs the baseline; a bench run's report stays under ``reports_dir``."""
    name = "performance baseline"
    try:
        baseline = load_json(baseline_path, "baseline")
        if bench_json is not None:
            report = load_json(bench_json, "bench report")
        else:
            reports_dir.mkdir(parents=True, exist_ok=True)
            report = run_bench(baseline, repo, Path(tempfile.mkdtemp(dir=reports_dir)))
        findings = compare(baseline, report)
    except (GateError, KeyError, TypeError, ValueError) as e:
        return GateResult(name, FAIL, f"cannot compare: {e}")
    if findings:
        return GateResult(name, FAIL, "; ".join(findings))
    return GateResult(
        name, PASS, f"{len(baseline['ratios'])} ratio(s) within {baseline['tolerance']:.0%}"
    )


# -- model consistency and hardware ----------------------------------------------------------------
def consistency_gate(repo: Path) -> GateResult:
    name = "model consistency"
    files = sorted(glob.glob(str(PROJECT_ROOT / PARITY_TESTS)))
    if not files:
        return GateResult(name, FAIL, f"no parity tests match {PARITY_TESTS}")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files]
    log.info("==> [gate] %s", " ".join(command))
    env = {"TRITONFORGE_MODEL_REPOSITORY": str(repo.resolve())}
    code = subprocess.call(command, cwd=PROJECT_ROOT, env={**os.environ, **env})
    shown = ", ".join(Path(f).name for f in files)
    if code != 0:
        return GateResult(name, FAIL, f"served != PyTorch: pytest exit {code} in {shown}")
    return GateResult(name, PASS, f"served == PyTorch ({shown})")


def gpu_providers() -> tuple[list[str], str]:
    """The GPU execution providers onnxruntime offers here, and why there are none."""
    from tritonforge.deploy import gpu_check

    try:
        import onnxruntime as ort

        return list(gpu_check.gpu_providers(ort.get_available_providers())), ""
    except ImportError as e:
        return [], f"onnxruntime is not importable ({e})"
    except gpu_check.NoGpuProviderError as e:
        return [], str(e)


def hardware_gate(
    repo: Path,
    detect: Callable[[], tuple[list[str], str]] = gpu_providers,
    check: Callable[[list[str]], int] | None = None,
) -> GateResult:
    """``deploy.gpu_check`` on a GPU host; a skip that says why elsewhere."""
    name = "hardware"
    providers, why = detect()
    if not providers:
        return GateResult(name, SKIP, f"skipped: no GPU on this host ({why})")
    if check is None:
        from tritonforge.deploy import gpu_check

        check = gpu_check.main
    code = check(["--model-repository", str(repo)])
    if code != 0:
        return GateResult(name, FAIL, f"GPU vs CPU parity failed (deploy.gpu_check exit {code})")
    return GateResult(name, PASS, f"GPU == CPU on {', '.join(providers)}")


# -- command line ----------------------------------------------------------------------------------
GATES = ("consistency", "hardware", "perf")


def summary(results: Sequence[GateResult]) -> tuple[int, str]:
    """Exit status (1 when any gate failed) and the summary text."""
    lines = [f"{r.status:<4} {r.name}: {r.detail}" for r in results]
    failed = [r.name for r in results if r.status == FAIL]
    lines.append(f"gates failed: {', '.join(failed)}" if failed else "all gates passed")
    return (1 if failed else 0), "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tritonforge.deploy.gate", description=__doc__)
    p.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    p.add_argument("--only", choices=GATES, action="append", help="run only these gates")
    p.add_argument("--baseline", type=Path, default=BASELINE)
    p.add_argument("--bench-json", type=Path, help="compare this bench report (skip the bench run)")
    p.add_argument(
        "--write-baseline",
        type=Path,
        metavar="BENCH_JSON",
        help="write --baseline from this bench report (reference and tolerance kept) and exit",
    )
    args = p.parse_args(argv)
    if args.write_baseline:
        old = load_json(args.baseline, "baseline")
        new = baseline_from(
            load_json(args.write_baseline, "bench report"), old["reference"], old["tolerance"]
        )
        new = {**old, **new}
        args.baseline.write_text(json.dumps(new, indent=2) + "\n")
        log.info("wrote %s: %s", args.baseline, new["ratios"])
        return 0
    selected = args.only or list(GATES)
    results = []
    if "consistency" in selected:
        results.append(consistency_gate(args.model_repository))
    if "hardware" in selected:
        results.append(hardware_gate(args.model_repository))
    if "perf" in selected:
        results.append(perf_gate(args.baseline, args.model_repository, args.bench_json))
    code, text = summary(results)
    print("\n==> [gate] summary\n" + text, flush=True)
    return code


if __name__ == "__main__":
    from tritonforge.logs import run_main

    raise SystemExit(run_main(main))
