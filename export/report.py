"""The export report: JSON (complete) and Markdown (the figures a reviewer reads).

:func:`write_report` writes both for every task; the Markdown's shared parts (header, artifacts,
timings) are here, each task renders its own sections (:func:`render_markdown` for an encoder,
:mod:`tasks.generation.export.report` for a decoder).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPORT_JSON = "export_report.json"
REPORT_MD = "export_report.md"
Render = Callable[[dict[str, Any]], str]


def _fmt(x: Any, digits: int = 3) -> str:
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def header_lines(report: dict[str, Any], artifact_label: str) -> list[str]:
    """Title, provenance and the artifacts table (``artifact_label``: its first column)."""
    lines = [
        f"# Export report: {report['spec']}",
        "",
        f"{report.get('description', '')}",
        "",
        f"- created: {report['created_utc']} (export took {report['timings_s'].get('total', 0):.1f} s)",
        f"- opset {report['opset']}; libraries: "
        + ", ".join(f"{k} {v}" for k, v in report["libraries"].items()),
        f"- inputs fingerprint: `{report['fingerprint']['digest'][:16]}`",
        "",
        "## Artifacts",
        "",
        f"| {artifact_label} | file | bytes | sha256 |",
        "|---|---|---|---|",
    ]
    for name, a in report["artifacts"].items():
        lines.append(f"| {name} | {a['file']} | {a['bytes']} | `{a['sha256'][:16]}…` |")
    return lines


def timings_lines(report: dict[str, Any]) -> list[str]:
    lines = ["", "## Timings (s)", ""]
    return lines + [f"- {k}: {v:.2f}" for k, v in report["timings_s"].items()]


def _figures(figures: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.4f}" for k, v in figures.items() if k != "sentences")


def _parity_lines(report: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "## Parity against PyTorch eager",
        "",
        f"Grid: {len(report['grid']['shapes'])} shapes (batch x seq) + "
        f"{len(report['grid']['mixed_batches'])} padded mixed-length batches.",
        "",
        "| artifact | max abs | max rel | worst shape | failures |",
        "|---|---|---|---|---|",
    ]
    for key, g in report["parity"].items():
        worst = g.get("worst") or {}
        lines.append(
            f"| {key} | {_fmt(g['max_abs'])} | {_fmt(g['max_rel'])} | "
            f"{worst.get('label', '-')} | {len(g['failures'])} |"
        )
    opt = report.get("optimization")
    if opt:
        lines += [
            "",
            "## Graph optimisation",
            "",
            f"Fused: {opt['fused']}; latency {opt['latency_ms']} ms -> speed-up "
            f"{opt['speedup']:.2f}x",
        ]
    return lines


def _int8_lines(q: dict[str, Any]) -> list[str]:
    chosen = q["search"]["chosen"]
    lines = [
        "",
        f"## int8 ({q['settings'].get('method', 'static_qdq')}, CPU)",
        "",
        f"- audit: {q['audit']['counts']}, problems: {len(q['audit']['problems'])}",
        f"- quality (held-out {q['quality']['sentences']} sentences): "
        + _figures(chosen["figures"])
        + f" (gate {q['gate']})",
        f"- kept in fp32: {chosen['excluded_groups'] or 'nothing'} "
        f"({len(chosen['excluded_nodes'])} of {q['search']['candidate_nodes']} weight nodes)",
        f"- latency {q['latency_ms']} ms -> speed-up vs fp32 "
        f"{q['speedup_vs_fp32']:.2f}x (vs optimised fp32 {q['speedup_vs_optimized']:.2f}x)",
        "",
        "| excluded | figures | pass |",
        "|---|---|---|",
    ]
    for t in q["search"]["trials"]:
        lines.append(
            f"| {t['excluded_groups'] or '-'} | {_figures(t['figures'])} | {t['passed']} |"
        )
    return lines


def _int8_target_lines(target: str, t: dict[str, Any]) -> list[str]:
    chosen = t["search"]["chosen"]
    return [
        "",
        f"## int8 for {target} hosts ({t['method']}, {t['file']})",
        "",
        f"- settings: {t['settings']}",
        f"- audit: {t['audit']['counts']}, problems: {len(t['audit']['problems'])}",
        f"- quality on CPU (onnxruntime, held-out {t['quality']['sentences']} sentences): "
        + _figures(chosen["figures"])
        + f" (gate {t['gate']})",
        f"- kept in fp32: {chosen['excluded_groups'] or 'nothing'} "
        f"({len(chosen['excluded_nodes'])} of {t['search']['candidate_nodes']} weight nodes)",
    ]


def render_markdown(report: dict[str, Any]) -> str:
    """An encoder export's report."""
    lines = header_lines(report, "model") + _parity_lines(report)
    q = report.get("quantization")
    if q:
        lines += _int8_lines(q)
    for target, t in (report.get("quantization_targets") or {}).items():
        lines += _int8_target_lines(target, t)
    tasks = report.get("task_metrics")
    if tasks:
        lines += ["", "## Task metrics (held-out set)", ""]
        lines += [f"- {variant}: {figures}" for variant, figures in tasks.items()]
    lines += timings_lines(report)
    return "\n".join(lines) + "\n"


def write_report(report: dict[str, Any], directory: Path, render: Render = render_markdown) -> None:
    (directory / REPORT_JSON).write_text(json.dumps(report, indent=2, default=str) + "\n")
    (directory / REPORT_MD).write_text(render(report))
