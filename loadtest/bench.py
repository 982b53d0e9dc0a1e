"""``python -m tritonforge.loadtest.bench`` (``make bench``): in-process limit vs FastAPI vs our Triton pipelines.

One run, one machine, one load generator (Locust, closed loop, 1 text per request):

1. the in-process limit: tokenize + ONNX Runtime + pool (+ normalise) in this process, batch 1 and
   batch 16 (naive padding to the longest text), for each encoder variant;
2. the usual alternative: FastAPI + uvicorn (one worker) + PyTorch eager (:mod:`loadtest.fastapi_app`);
3. our pipelines (ensemble and BLS x fp32 and int8) over HTTP and gRPC on the embedded Triton,

at each concurrency (default 1, 4, 16). All services are started first, then every configuration
is measured in ``--repeats`` interleaved rounds (a noisy neighbour on a shared machine then hits
every target alike) and the table shows per-cell medians. Ratios: served throughput / in-process
batch-16 throughput and served p50 / in-process batch-1 p50 (same variant), and throughput / p99
against FastAPI at the same concurrency. The issue's targets are printed as met/missed (never
asserted). Writes JSON (medians and every round) + a PNG chart under ``--reports-dir``. Defaults
(2 rounds x 27 cells x ~10 s) take about 10 minutes; ``--duration-s``, ``--repeats``,
``--concurrency``, ``--pipelines``, ``--variants``, ``--protocols`` shorten it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tritonforge.loadtest import corpus
from tritonforge.loadtest.run import exit_on_sigterm, locust_command
from tritonforge.runtime.server import ADMIN_HEADER, free_port, serving

HERE = Path(__file__).resolve().parent
NO_SLO = ["--slo-p95-ms", "1e9", "--slo-p99-ms", "1e9", "--slo-min-rps", "0"]
NO_SLO += ["--slo-max-fail-ratio", "1"]


@dataclass(frozen=True)
class Target:
    """One served configuration to load."""

    system: str  # "triton" | "fastapi"
    protocol: str  # "http" | "grpc"
    pipeline: str = "-"
    variant: str = "fp32"

    @property
    def label(self) -> str:
        if self.system == "fastapi":
            return "fastapi+torch http"
        return f"{self.pipeline} {self.variant} {self.protocol}"


@dataclass
class Cell:
    target: Target
    concurrency: int
    summary: dict[str, float]
    exit_code: int


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_gb = float("nan")
    with contextlib.suppress(OSError, ValueError, IndexError):
        kb = Path("/proc/meminfo").read_text().split("\n")[0].split()[1]
        mem_gb = int(kb) / 1024 / 1024
    import locust
    import onnxruntime
    import torch

    return {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "memory_gb": round(mem_gb, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "onnxruntime": onnxruntime.__version__,
        "torch": torch.__version__,
        "locust": locust.__version__,
        "load_average_at_start": os.getloadavg(),
    }


def run_cell(
    target: Target,
    concurrency: int,
    *,
    host: str,
    grpc_url: str,
    duration_s: float,
    warmup_s: float,
    workdir: Path,
) -> Cell:
    """One bounded Locust run; the summary comes from the exact samples after warm-up."""
    samples = workdir / f"cell-{time.monotonic_ns()}.json"
    extra = [*NO_SLO, "--samples-out", str(samples), "--warmup-s", str(warmup_s)]
    if target.system == "fastapi":
        locustfile, classes = HERE / "fastapi_locustfile.py", ["FastApiUser"]
    else:
        locustfile = HERE / "locustfile.py"
        classes = ["TritonHttpUser" if target.protocol == "http" else "TritonGrpcUser"]
        extra += ["--pipeline", target.pipeline, "--variant", target.variant]
        extra += ["--grpc-url", grpc_url]
    command = locust_command(
        locustfile=locustfile,
        user_classes=classes,
        host=host,
        users=concurrency,
        duration_s=duration_s + warmup_s,
        extra=[*extra, "--loglevel", "WARNING"],
    )
    # Bounded: a Locust run that outlives its duration by a minute is killed and tried once more
    # (a rare stall at shutdown on this shared machine must not hang the whole bench).
    limit_s = duration_s + warmup_s + 60
    for attempt in (1, 2):
        try:
            proc = subprocess.run(
                command, capture_output=True, text=True, check=False, timeout=limit_s
            )
            break
        except subprocess.TimeoutExpired as e:
            print(
                f"    locust exceeded {limit_s:.0f} s (attempt {attempt}); killed", file=sys.stderr
            )
            proc = subprocess.CompletedProcess(
                command, -9, str(e.stdout or ""), str(e.stderr or "")
            )
            samples.unlink(missing_ok=True)
    try:
        summary = json.loads(samples.read_text())
    except (OSError, ValueError):
        print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
        summary = {"requests": 0, "failures": -1, "sentences_per_s": 0.0}
        summary.update({k: math.nan for k in ("p50_ms", "p95_ms", "p99_ms")})
    return Cell(target, concurrency, summary, proc.returncode)


def _wait_http(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as response:
            if response.status == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer within {timeout_s:.0f} s")


@contextlib.contextmanager
def fastapi_service() -> Iterator[str]:
    """The baseline service in its own process (one uvicorn worker); yields its base URL."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tritonforge.loadtest.fastapi_app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        cwd=HERE.parent,
    )
    try:
        _wait_http(f"http://127.0.0.1:{port}/health", 120)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def load_embedders(repo: Path, variants: Sequence[str]) -> dict[str, Any]:
    """One in-process embedder per variant whose ONNX file exists."""
    from tritonforge.loadtest.inprocess import InProcessEmbedder, tokenizer_path

    embedders: dict[str, Any] = {}
    for variant in variants:
        onnx = repo / f"encoder_{variant}" / "1" / "model.onnx"
        if not onnx.exists():
            print(f"   (no {onnx}: in-process {variant} skipped; run `make export`)")
            continue
        embedders[variant] = InProcessEmbedder(onnx, tokenizer_path(repo))
    return embedders


def measure_inprocess(
    embedders: dict[str, Any], texts: Sequence[str], duration_s: float
) -> list[dict[str, Any]]:
    from tritonforge.loadtest.inprocess import measure

    results = []
    for variant, embedder in embedders.items():
        for batch in (1, 16):
            r = measure(embedder, texts, variant=variant, batch=batch, duration_s=duration_s)
            print(
                f"   in-process {variant} batch {batch:2d}: {r.sentences_per_s:7.1f} sent/s  "
                f"p50 {r.p50_ms:6.1f} ms  p99 {r.p99_ms:6.1f} ms  "
                f"(padding {r.padded_token_share:.0%} of tokens)",
                flush=True,
            )
            results.append(r.as_dict())
    return results


def _median_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per numeric field, the median over repeats (counts are summed); other fields from the first."""
    out = dict(rows[0])
    for key, value in rows[0].items():
        if key in ("batch", "concurrency"):
            continue
        if isinstance(value, int | float) and not isinstance(value, bool):
            values = [float(r[key]) for r in rows]
            if key in ("requests", "failures", "calls", "sentences"):
                out[key] = int(sum(values))
            else:
                out[key] = float(statistics.median(values))
    out["repeats"] = len(rows)
    return out


def aggregate(
    cells: list[Cell], inproc: list[dict[str, Any]]
) -> tuple[list[Cell], list[dict[str, Any]]]:
    """Medians over the interleaved rounds, per (target, concurrency) and (variant, batch)."""
    by_cell: dict[tuple[Target, int], list[Cell]] = {}
    for c in cells:
        by_cell.setdefault((c.target, c.concurrency), []).append(c)
    merged = [
        Cell(t, conc, _median_rows([c.summary for c in group]), max(c.exit_code for c in group))
        for (t, conc), group in by_cell.items()
    ]
    by_ip: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in inproc:
        by_ip.setdefault((r["variant"], r["batch"]), []).append(r)
    return merged, [_median_rows(group) for group in by_ip.values()]


def _ratio(a: float, b: float | None) -> float:
    if b is None or not b or math.isnan(b) or math.isnan(a):
        return math.nan
    return a / b


def analyse(
    cells: list[Cell], inproc: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows with ratios, and the issue's targets as lines ``MET``/``MISSED`` with the numbers."""
    best = {(r["variant"], r["batch"]): r for r in inproc}
    fastapi = {c.concurrency: c.summary for c in cells if c.target.system == "fastapi"}
    rows = []
    for c in cells:
        s = c.summary
        ip16 = best.get((c.target.variant, 16))
        ip1 = best.get((c.target.variant, 1))
        fa = fastapi.get(c.concurrency)
        rows.append(
            {
                **asdict(c.target),
                "label": c.target.label,
                "concurrency": c.concurrency,
                **s,
                "x_inprocess_throughput": _ratio(
                    s["sentences_per_s"], ip16["sentences_per_s"] if ip16 else None
                ),
                "x_inprocess_p50": _ratio(s["p50_ms"], ip1["p50_ms"] if ip1 else None),
                "x_fastapi_throughput": _ratio(
                    s["sentences_per_s"], fa["sentences_per_s"] if fa else None
                ),
                "x_fastapi_p99": _ratio(s["p99_ms"], fa["p99_ms"] if fa else None),
            }
        )

    def get(pipeline: str, variant: str, protocol: str, conc: int) -> dict[str, Any] | None:
        for r in rows:
            if (r["system"], r["pipeline"], r["variant"], r["protocol"], r["concurrency"]) == (
                "triton",
                pipeline,
                variant,
                protocol,
                conc,
            ):
                return r
        return None

    def verdict(ok: bool) -> str:
        return "MET   " if ok else "MISSED"  # NaN compares False: shown as MISSED with "nan"

    lines = []
    top = max((r["concurrency"] for r in rows), default=16)
    for protocol in ("http", "grpc"):
        fp32 = get("ensemble", "fp32", protocol, top)
        if fp32 is None:
            continue
        x = fp32["x_inprocess_throughput"]
        lines.append(
            f"{verdict(x >= 1.10)} fp32 ensemble {protocol} @{top}: {x:.2f}x in-process batch-16 "
            "(target >= 1.10x)"
        )
        ip_best = max(
            (r["sentences_per_s"] for r in inproc if r["variant"] == "fp32"), default=math.nan
        )
        lines.append(
            f"(info) fp32 ensemble {protocol} @{top}: "
            f"{_ratio(fp32['sentences_per_s'], ip_best):.2f}x the best in-process batch size"
        )
        one = get("ensemble", "fp32", protocol, 1)
        if one is not None:
            x1 = one["x_inprocess_p50"]
            lines.append(
                f"{verdict(x1 <= 1.15)} fp32 ensemble {protocol} @1: p50 {x1:.2f}x in-process "
                "batch-1 (target <= 1.15x)"
            )
        int8 = get("ensemble", "int8", protocol, top)
        if int8 is not None:
            xi = _ratio(int8["sentences_per_s"], fp32["sentences_per_s"])
            lines.append(
                f"{verdict(xi >= 1.5)} int8 ensemble {protocol} @{top}: {xi:.2f}x fp32 served "
                "(target >= 1.5x)"
            )
        xf, xp = fp32["x_fastapi_throughput"], fp32["x_fastapi_p99"]
        if not math.isnan(xf):
            lines.append(
                f"{verdict(xf >= 2.5)} fp32 ensemble {protocol} @{top}: {xf:.2f}x FastAPI "
                "throughput (target >= 2.5x)"
            )
            lines.append(
                f"{verdict(xp <= 0.5)} fp32 ensemble {protocol} @{top}: p99 {xp:.2f}x FastAPI's "
                "(target <= 0.5x)"
            )
        for variant in ("fp32", "int8"):
            bls, ens = get("bls", variant, protocol, top), get("ensemble", variant, protocol, top)
            if bls is not None and ens is not None:
                xb = _ratio(bls["sentences_per_s"], ens["sentences_per_s"])
                lines.append(
                    f"{verdict(xb >= 0.9)} BLS {variant} {protocol} @{top}: {xb:.2f}x the ensemble "
                    "(target >= 0.90x)"
                )
    return rows, lines


def table(rows: list[dict[str, Any]], inproc: list[dict[str, Any]]) -> str:
    head = (
        f"{'target':<26}{'conc':>5}{'sent/s':>9}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}"
        f"{'fail':>6}{'thr/inproc16':>14}{'p50/inproc1':>13}{'thr/fastapi':>13}{'p99/fastapi':>13}"
    )
    out = [head, "-" * len(head)]
    for r in inproc:
        out.append(
            f"{'in-process ' + r['variant'] + ' b' + str(r['batch']):<26}{'-':>5}"
            f"{r['sentences_per_s']:9.1f}{r['p50_ms']:9.1f}{r['p95_ms']:9.1f}{r['p99_ms']:9.1f}"
            f"{0:6d}{'':>14}{'':>13}{'':>13}{'':>13}"
        )
    for r in rows:
        out.append(
            f"{r['label']:<26}{r['concurrency']:5d}{r['sentences_per_s']:9.1f}{r['p50_ms']:9.1f}"
            f"{r['p95_ms']:9.1f}{r['p99_ms']:9.1f}{int(r.get('failures', 0)):6d}"
            f"{r['x_inprocess_throughput']:14.2f}{r['x_inprocess_p50']:13.2f}"
            f"{r['x_fastapi_throughput']:13.2f}{r['x_fastapi_p99']:13.2f}"
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
                label=f"in-process {r['variant']} batch 16",
            )
    for ax, title in ((ax_t, "throughput (sentences/s)"), (ax_l, "p99 latency (ms)")):
        ax.set_xticks([j + width * (len(concs) - 1) / 2 for j in range(len(labels))])
        ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=8)
        ax.set_title(title)
        ax.legend(fontsize=8)
    ax_l.set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def targets_from(args: argparse.Namespace) -> list[Target]:
    out = []
    for pipeline in args.pipelines:
        for variant in args.variants:
            for protocol in args.protocols:
                out.append(Target("triton", protocol, pipeline, variant))
    return out


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tritonforge.loadtest.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    parser.add_argument(
        "--url",
        default=os.environ.get("TRITONFORGE_BENCH_URL") or None,
        help="HTTP host:port of a running Triton (default: embedded)",
    )
    parser.add_argument("--grpc-url", default=None, help="with --url (default URL host:8001)")
    parser.add_argument(
        "--duration-s",
        type=float,
        default=float(os.environ.get("TRITONFORGE_BENCH_DURATION_S", "5")),
        help="measured seconds per cell (after --warmup-s)",
    )
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--inprocess-s", type=float, default=4.0, help="seconds per in-process run")
    parser.add_argument(
        "--concurrency", type=lambda v: [int(x) for x in _csv(v)], default=[1, 4, 16]
    )
    parser.add_argument("--pipelines", type=_csv, default=["ensemble", "bls"])
    parser.add_argument("--variants", type=_csv, default=["fp32", "int8"])
    parser.add_argument("--protocols", type=_csv, default=["http", "grpc"])
    parser.add_argument(
        "--repeats",
        type=int,
        default=int(os.environ.get("TRITONFORGE_BENCH_REPEATS", "2")),
        help="interleaved rounds over all targets; the table shows medians",
    )
    parser.add_argument("--skip-fastapi", action="store_true")
    parser.add_argument(
        "--perf-analyzer",
        action="store_true",
        help="also measure each Triton target with NVIDIA perf_analyzer at the top concurrency "
        "(python -m tritonforge.loadtest.perf_analyzer install)",
    )
    parser.add_argument("--skip-inprocess", action="store_true")
    parser.add_argument("--reports-dir", type=Path, default=Path("reports"))
    args = parser.parse_args(argv)
    exit_on_sigterm()

    texts = corpus.generate()
    args.reports_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    info = machine()
    print(f"==> bench on {info['cpu']} x{info['logical_cpus']}, corpus {corpus.describe(texts)}")
    inproc: list[dict[str, Any]] = []
    cells: list[Cell] = []
    pa_rows: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="tritonforge-bench-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        workdir = Path(tmp)

        def second_opinion(
            targets: list[Target], http: str, grpc_url: str, headers: dict[str, str]
        ) -> None:
            from tritonforge.client.settings import route
            from tritonforge.loadtest import perf_analyzer

            top = max(args.concurrency)
            print(f"==> perf_analyzer (second opinion) at concurrency {top}", flush=True)
            for target in targets:
                model, parameters = route(target.pipeline, target.variant)
                try:
                    r = perf_analyzer.measure(
                        model=model, url=http if target.protocol == "http" else grpc_url,
                        protocol=target.protocol, concurrency=top, texts=texts,
                        window_ms=int(args.duration_s * 1000), workdir=workdir,
                        parameters=parameters, headers=headers,
                    )  # fmt: skip
                except perf_analyzer.PerfAnalyzerError as e:
                    print(f"   {target.label}: {e}")
                    continue
                print(
                    f"   {target.label:<24} @{top:<3} {r['infer_per_s']:7.1f} sent/s  "
                    f"p50 {r['p50_ms']:7.1f}  p99 {r['p99_ms']:7.1f} ms",
                    flush=True,
                )
                pa_rows.append({"label": target.label, "concurrency": top, **r})

        # Everything is started first and measured in interleaved rounds, so that a noisy
        # neighbour on a shared machine hits every target alike (medians over --repeats rounds).
        plan: list[tuple[Target, str]] = []
        if not args.skip_fastapi:
            print("==> starting FastAPI + uvicorn (1 worker) + PyTorch eager", flush=True)
            plan.append((Target("fastapi", "http"), stack.enter_context(fastapi_service())))
        targets = targets_from(args)
        http = grpc = ""
        headers: dict[str, str] = {}
        if targets:
            if args.url:
                http = args.url.removeprefix("http://")
                grpc = args.grpc_url or f"{http.rsplit(':', 1)[0]}:8001"
                key = os.environ.get("TRITONFORGE_ADMIN_KEY")
                headers = {ADMIN_HEADER: key} if key else {}
                print(f"==> Triton at {http} / {grpc}", flush=True)
            else:
                print(f"==> starting the embedded Triton on {args.model_repository}", flush=True)
                server = stack.enter_context(serving(args.model_repository))
                http, grpc, headers = server.http_url, server.grpc_url, server.admin_headers
            plan += [(t, f"http://{http}") for t in targets]
        embedders = (
            {} if args.skip_inprocess else load_embedders(args.model_repository, args.variants)
        )
        for round_ in range(1, args.repeats + 1):
            print(f"==> round {round_}/{args.repeats}", flush=True)
            inproc += measure_inprocess(embedders, texts, args.inprocess_s)
            for target, host in plan:
                for conc in args.concurrency:
                    cell = run_cell(
                        target, conc, host=host, grpc_url=grpc, duration_s=args.duration_s,
                        warmup_s=args.warmup_s, workdir=workdir,
                    )  # fmt: skip
                    s = cell.summary
                    print(
                        f"   {target.label:<24} @{conc:<3} {s['sentences_per_s']:7.1f} sent/s  "
                        f"p50 {s['p50_ms']:7.1f}  p99 {s['p99_ms']:7.1f} ms  "
                        f"failures {int(s.get('failures', 0))}",
                        flush=True,
                    )
                    cells.append(cell)
        if args.perf_analyzer and targets:
            second_opinion(targets, http, grpc, headers)

    raw_cells = [
        {"label": c.target.label, "concurrency": c.concurrency, **c.summary} for c in cells
    ]
    raw_inproc = list(inproc)
    cells, inproc = aggregate(cells, inproc)
    rows, verdicts = analyse(cells, inproc)
    print()
    print(table(rows, inproc))
    print("\nTargets (reported, not asserted):")
    for line in verdicts:
        print(f"  {line}")
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
        "perf_analyzer": pa_rows,
        "rounds": {"cells": raw_cells, "inprocess": raw_inproc},
    }
    json_path = args.reports_dir / f"bench-{stamp}.json"
    json_path.write_text(json.dumps(report, indent=2, default=str))
    png_path = args.reports_dir / f"bench-{stamp}.png"
    if rows:
        chart(rows, inproc, png_path)
    print(f"\n==> wrote {json_path} and {png_path} ({report['elapsed_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
