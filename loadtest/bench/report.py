"""The bench's report: the table, the per-stage breakdown and the chart."""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tritonforge.loadtest import corpus
from tritonforge.loadtest.bench.aggregation import aggregate, analyse
from tritonforge.loadtest.bench.cells import Cell, task_bench
from tritonforge.loadtest.bench.text_causes import COMPUTE, per_request_ms

log = logging.getLogger(__name__)


def _inproc_label(r: dict[str, Any]) -> str:
    task = r.get("task")
    what = f"{r['name']} " if task and task_bench(task) is not None else ""
    return f"in-process {what}{r['variant']} b{r['batch']}"


def table(rows: list[dict[str, Any]], inproc: list[dict[str, Any]]) -> str:
    head = (
        f"{'target':<30}{'conc':>5}{'sent/s':>9}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}"
        f"{'fail':>6}{'thr/inproc1':>12}{'p50-inproc1':>12}{'thr/fastapi':>12}"
        f"{'p99/fastapi':>12}{'gen cpu':>8}{'srv ms/req':>11}  status"
    )
    out = [head, "-" * len(head)]
    for r in inproc:
        out.append(
            f"{_inproc_label(r):<30}{'-':>5}"
            f"{r['sentences_per_s']:9.1f}{r['p50_ms']:9.1f}{r['p95_ms']:9.1f}{r['p99_ms']:9.1f}"
            f"{0:6d}"
        )
    for r in rows:
        out.append(
            f"{r['label']:<30}{r['concurrency']:5d}{r['sentences_per_s']:9.1f}{r['p50_ms']:9.1f}"
            f"{r['p95_ms']:9.1f}{r['p99_ms']:9.1f}{int(r.get('failures', 0)):6d}"
            f"{r['x_inprocess_throughput']:12.2f}{r['p50_minus_inprocess_ms']:+12.1f}"
            f"{r['x_fastapi_throughput']:12.2f}{r['x_fastapi_p99']:12.2f}"
            f"{r['generator_cpu_share']:8.0%}{r['server_cpu_ms_per_request']:11.1f}  {r['status']}"
        )
    return "\n".join(out)


def stage_breakdown(rows: list[dict[str, Any]]) -> str:
    """Where the time goes per stage (Triton's statistics summed over the cell's rounds)."""
    out = []
    for r in rows:
        stats = r.get("server_stats") or {}
        if not stats:
            continue
        out.append(f"{r['label']} @{r['concurrency']}:")
        for model, v in sorted(stats.items()):
            n, ex = v.get("inference_count", 0), v.get("execution_count", 0)
            if not n:
                continue
            queue, c_in, infer, c_out = (per_request_ms(v, k) for k in ("queue", *COMPUTE))
            out.append(
                f"    {model:<22} {int(n):6d} inferences in {int(ex):6d} executions "
                f"(batch {n / max(ex, 1):4.2f})  queue {queue:7.2f} ms  "
                f"compute in {c_in:5.2f} infer {infer:6.2f} out {c_out:5.2f} ms"
            )
    return "\n".join(out)


def chart(rows: list[dict[str, Any]], inproc: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(dict.fromkeys(r["label"] for r in rows))
    concs = sorted({r["concurrency"] for r in rows})
    fig, (ax_t, ax_l) = plt.subplots(1, 2, figsize=(15, 6))
    width = 0.8 / max(1, len(concs))
    for i, conc in enumerate(concs):
        xs = [j + i * width for j in range(len(labels))]
        by = {r["label"]: r for r in rows if r["concurrency"] == conc}
        ax_t.bar(
            xs,
            [by[lb]["sentences_per_s"] if lb in by else 0 for lb in labels],
            width,
            label=f"concurrency {conc}",
        )
        ax_l.bar(
            xs,
            [by[lb]["p99_ms"] if lb in by else 0 for lb in labels],
            width,
            label=f"concurrency {conc}",
        )
    styles = iter(["--", ":", "-.", (0, (1, 5))])
    for r in inproc:
        if r["batch"] == 16:
            ax_t.axhline(
                r["sentences_per_s"],
                color="k",
                linestyle=next(styles, "--"),
                label=_inproc_label(r),
            )
    for ax, title in ((ax_t, "throughput (sentences/s)"), (ax_l, "p99 latency (ms)")):
        ax.set_xticks([j + width * (len(concs) - 1) / 2 for j in range(len(labels))])
        ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=8)
        ax.set_title(title)
        ax.legend(fontsize=8)
    # a log axis needs one positive latency: a run whose cells all failed plots NaN bars
    if any(r["p99_ms"] > 0 for r in rows):
        ax_l.set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(
    args: argparse.Namespace,
    info: dict[str, Any],
    started: float,
    texts: Sequence[str],
    cells: list[Cell],
    inproc: list[dict[str, Any]],
) -> None:
    """Print the table, the verdicts and the per-stage breakdown of the medians over the rounds;
    write ``bench-<stamp>.json`` (medians and every round) and ``.png`` into ``--reports-dir``."""
    raw_cells = [
        {
            "label": c.target.label,
            "concurrency": c.concurrency,
            **c.summary,
            "status": c.status,
            "generator_cpu_share": c.generator_cpu_share,
        }
        for c in cells
    ]
    raw_inproc = list(inproc)
    cells, inproc = aggregate(cells, inproc)
    rows, verdicts = analyse(cells, inproc)
    print()
    print(table(rows, inproc))
    print("\nTargets (reported, not asserted):")
    for line in verdicts:
        print(f"  {line}")
    breakdown = stage_breakdown([r for r in rows if r["concurrency"] in (1, max(args.concurrency))])
    if breakdown:
        print("\nWhere the time goes (Triton statistics per stage, summed over rounds):")
        print(breakdown)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    report = {
        "machine": info,
        "load_average_at_end": os.getloadavg(),
        "elapsed_s": round(time.time() - started, 1),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "corpus": corpus.describe(texts),
        "inprocess": inproc,
        "cells": rows,
        "targets": verdicts,
        "rounds": {"cells": raw_cells, "inprocess": raw_inproc},
    }
    json_path = args.reports_dir / f"bench-{stamp}.json"
    json_path.write_text(json.dumps(report, indent=2, default=str))
    png_path = args.reports_dir / f"bench-{stamp}.png"
    if rows:
        chart(rows, inproc, png_path)
    log.info("==> wrote %s and %s (%.0f s)", json_path, png_path, report["elapsed_s"])
