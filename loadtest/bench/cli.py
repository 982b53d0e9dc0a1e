"""``python -m tritonforge.loadtest.bench`` (``make bench``): in-process limit vs FastAPI vs our Triton pipelines.

One run, one machine, closed-loop load (no think time), 1 text per request:

1. the in-process limit: tokenize + ONNX Runtime (pooling and normalisation in the graph) in this
   process, batch 1 and batch 16 (naive padding to the longest text), for each encoder variant;
2. the usual alternative: FastAPI + uvicorn (one worker) + PyTorch eager (:mod:`loadtest.anchors.fastapi.embed`);
3. our pipelines (ensemble and BLS x fp32 and int8) on the embedded Triton, loaded by two
   generators: Locust over HTTP (the same generator as FastAPI's, for the like-for-like ratios) and
   NVIDIA perf_analyzer over gRPC (C++, a fraction of Locust's CPU on 2 cores);

at each concurrency (default 1, 4, 16). All services are started first, then every configuration
is measured in ``--repeats`` interleaved rounds (a noisy neighbour on a shared machine then hits
every target alike) and the table shows per-cell medians, each generator's own CPU share, and a
status: a stalled or failed cell is reported as such, and the table, JSON and PNG are still
written. Triton's per-model statistics around each cell give the per-stage breakdown. The issue's
targets are printed as met/missed (never asserted). Writes JSON (medians and every round) + a PNG
chart under ``--reports-dir``. Defaults take about 10 minutes; ``--duration-s``, ``--repeats``,
``--concurrency``, ``--pipelines``, ``--variants``, ``--locust-protocols``, ``--pa-protocols``
shorten or widen it.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from tritonforge.env import env_float, env_int
from tritonforge.headers import ADMIN_HEADER
from tritonforge.loadtest import corpus
from tritonforge.loadtest.bench.cells import (
    OPENAI,
    Cell,
    Target,
    bench_pipeline,
    classify_pipelines,
    targets_from,
    task_bench,
)
from tritonforge.loadtest.bench.report import write_report
from tritonforge.loadtest.bench.runners import (
    load_embedders,
    machine,
    measure_inprocess,
    model_stats,
    run_locust_cell,
    run_perf_analyzer_cell,
    server_cpu_s,
    stats_delta,
)
from tritonforge.loadtest.bench.services import fastapi_service, start_predict_service
from tritonforge.loadtest.locust.options import check_environment
from tritonforge.loadtest.locust.run import exit_on_sigterm
from tritonforge.logs import run_main
from tritonforge.pipelines import Pipeline
from tritonforge.progress import Bar
from tritonforge.runtime.serving import serving

log = logging.getLogger(__name__)


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _add_load_options(parser: argparse.ArgumentParser) -> None:
    """Where and how long: the repository or server, durations, concurrency, what to load."""
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
        default=env_float("TRITONFORGE_BENCH_DURATION_S", 5.0, minimum=0.1),
        help="measured seconds per cell (after --warmup-s)",
    )
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--inprocess-s", type=float, default=4.0, help="seconds per in-process run")
    parser.add_argument(
        "--concurrency", type=lambda v: [int(x) for x in _csv(v)], default=[1, 4, 16]
    )
    parser.add_argument("--pipelines", type=_csv, default=["ensemble", "bls"])
    parser.add_argument(
        "--variants",
        type=_csv,
        default=["fp32", "int8"],
        help="variants to compare (skipped where the discovered pipeline lacks one)",
    )
    parser.add_argument(
        "--pipeline-name",
        default=None,
        help="embedding pipeline (default: the discovered default)",
    )


def _add_scope_options(parser: argparse.ArgumentParser) -> None:
    """Which generators and cells: protocols, rounds, what to skip, where the reports go."""
    parser.add_argument(
        "--locust-protocols",
        type=_csv,
        default=["http", OPENAI],
        help="protocols Locust loads Triton over (FastAPI is always Locust/HTTP, so this is the "
        f"same-generator comparison; {OPENAI!r}: OpenAI's /v1/embeddings, ensembles only); gRPC "
        "under gevent can stall (locust#2369), hence off by default",
    )
    parser.add_argument(
        "--pa-protocols",
        type=_csv,
        default=["grpc"],
        help="protocols NVIDIA perf_analyzer loads Triton over ('' for none)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=env_int("TRITONFORGE_BENCH_REPEATS", 2, minimum=1),
        help="interleaved rounds over all targets; the table shows medians",
    )
    parser.add_argument("--skip-fastapi", action="store_true")
    parser.add_argument(
        "--skip-classify", action="store_true", help="no classification pipeline cells"
    )
    parser.add_argument(
        "--skip-embedding", action="store_true", help="only the classification pipelines' cells"
    )
    parser.add_argument(
        "--classify-checkpoint",
        type=Path,
        default=None,
        help="the Hugging Face directory the classifier was exported from, for the FastAPI "
        "/predict baseline (default: its registry spec's; checked against the export report)",
    )
    parser.add_argument("--skip-inprocess", action="store_true")
    parser.add_argument("--reports-dir", type=Path, default=Path("reports"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tritonforge.loadtest.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_load_options(parser)
    _add_scope_options(parser)
    return parser


@dataclass
class Setup:
    """What a bench run loads, all started before the first round: the plan, the FastAPI
    baselines' URLs, Triton's addresses and the in-process models."""

    pipeline: Pipeline | None
    classifiers: list[Pipeline]
    plan: list[Target] = field(default_factory=list)
    fastapi_urls: dict[tuple[str, str], str] = field(default_factory=dict)
    http: str = ""
    grpc: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    server_pid: int | None = None
    embedders: dict[str, Any] = field(default_factory=dict)
    in_process_classifiers: dict[str, dict[str, Any]] = field(default_factory=dict)
    warned: bool = False


def _bench(pipeline: Pipeline) -> ModuleType:
    """The bench cell of ``pipeline``'s task (one of ``Setup.classifiers``: it has one)."""
    cell = task_bench(pipeline.task)
    assert cell is not None  # classify_pipelines keeps the pipelines whose task has one
    return cell


def _start_baselines(stack: contextlib.ExitStack, args: argparse.Namespace, setup: Setup) -> None:
    log.info("==> starting FastAPI + uvicorn (1 worker) + PyTorch eager")
    if setup.pipeline is not None:
        embedding_baseline = stack.enter_context(fastapi_service(args.model_repository))
        setup.fastapi_urls[(setup.pipeline.task, setup.pipeline.name)] = embedding_baseline
        setup.plan.append(Target("fastapi", "http", name=setup.pipeline.name))
    for cp in setup.classifiers:
        url = start_predict_service(stack, args, cp)
        if url:
            setup.fastapi_urls[(cp.task, cp.name)] = url
            setup.plan.append(Target("fastapi", "http", name=cp.name, task=cp.task))


def _start_triton(stack: contextlib.ExitStack, args: argparse.Namespace, setup: Setup) -> None:
    if args.url:
        setup.http = args.url.removeprefix("http://")
        setup.grpc = args.grpc_url or f"{setup.http.rsplit(':', 1)[0]}:8001"
        key = os.environ.get("TRITONFORGE_ADMIN_KEY")
        setup.headers = {ADMIN_HEADER: key} if key else {}
        log.info("==> Triton at %s / %s", setup.http, setup.grpc)
    else:
        log.info("==> starting the embedded Triton on %s", args.model_repository)
        server = stack.enter_context(serving(args.model_repository))
        setup.http, setup.grpc, setup.headers = (
            server.http_url,
            server.grpc_url,
            server.admin_headers,
        )
        setup.server_pid = server.pid


def start(stack: contextlib.ExitStack, args: argparse.Namespace) -> Setup:
    """Start everything the run loads (stopped by ``stack``) and load the in-process models.

    Everything is started first and measured in interleaved rounds, so that a noisy neighbour on
    a shared machine hits every target alike (medians over --repeats rounds)."""
    setup = Setup(
        # --skip-embedding: no embedding pipeline is needed (a repository of classifiers only)
        pipeline=None if args.skip_embedding else bench_pipeline(args),
        classifiers=[] if args.skip_classify else classify_pipelines(args),
    )
    if not args.skip_fastapi:
        _start_baselines(stack, args, setup)
    targets = [] if setup.pipeline is None else targets_from(args, setup.pipeline)
    for cp in setup.classifiers:
        targets += targets_from(args, cp)
    if targets:
        _start_triton(stack, args, setup)
        setup.plan += targets
    if any(t.generator == "perf_analyzer" for t in setup.plan):
        from tritonforge.loadtest.perf_analyzer import tool as perf_analyzer

        if perf_analyzer.binary() is None:
            log.warning(
                "   perf_analyzer is not installed (python -m tritonforge.loadtest.perf_analyzer.tool install): "
                "its cells are reported as failed"
            )
    if not args.skip_inprocess and setup.pipeline is not None:
        setup.embedders = load_embedders(args.model_repository, setup.pipeline, args.variants)
    setup.in_process_classifiers = {
        cp.name: _bench(cp).load_classifiers(args.model_repository, cp, args.variants)
        for cp in ([] if args.skip_inprocess else setup.classifiers)
    }
    return setup


def measure_cell(
    setup: Setup,
    args: argparse.Namespace,
    target: Target,
    conc: int,
    texts: Sequence[str],
    workdir: Path,
) -> Cell:
    """One cell: its generator's bounded run, with Triton's statistics and CPU time around it."""
    http, grpc, headers = setup.http, setup.grpc, setup.headers
    before = model_stats(http, headers) if target.system == "triton" else {}
    cpu_before = server_cpu_s(setup.server_pid)
    if target.system == "triton" and not before and not setup.warned:
        setup.warned = True
        log.warning(
            "   (Triton's statistics API did not answer: no per-stage breakdown; "
            "for a running server set TRITONFORGE_ADMIN_KEY)"
        )
    if target.generator == "perf_analyzer":
        cell = run_perf_analyzer_cell(
            target, conc, url=http if target.protocol == "http" else grpc,
            texts=texts, duration_s=args.duration_s, workdir=workdir,
            headers=headers,
        )  # fmt: skip
    else:
        host = (
            setup.fastapi_urls[(target.task, target.name)]
            if target.system == "fastapi"
            else f"http://{http}"
        )
        cell = run_locust_cell(
            target, conc, host=host, grpc_url=grpc, duration_s=args.duration_s,
            warmup_s=args.warmup_s, workdir=workdir,
            model_repository=args.model_repository,
        )  # fmt: skip
    if target.system == "triton":
        cell.server_stats = stats_delta(before, model_stats(http, headers))
        served = cell.server_stats.get(target.model, {}).get("inference_count", 0.0)
        used = server_cpu_s(setup.server_pid) - cpu_before
        cell.server_cpu_ms_per_request = used * 1000 / served if served else math.nan
    return cell


def run_round(
    setup: Setup,
    args: argparse.Namespace,
    texts: Sequence[str],
    workdir: Path,
    bar: Bar,
) -> tuple[list[Cell], list[dict[str, Any]]]:
    """One round: the in-process limits, then every cell of the plan at every concurrency."""
    inproc: list[dict[str, Any]] = []
    cells: list[Cell] = []
    if setup.pipeline is not None:
        inproc += measure_inprocess(
            setup.embedders, texts, args.inprocess_s, name=setup.pipeline.name
        )
    for cp in setup.classifiers:
        models = setup.in_process_classifiers.get(cp.name, {})
        inproc += measure_inprocess(models, texts, args.inprocess_s, cp.task, cp.name)
    for target in setup.plan:
        for conc in args.concurrency:
            cell = measure_cell(setup, args, target, conc, texts, workdir)
            s = cell.summary
            log.info(
                f"   {target.label:<30} @{conc:<3} {s['sentences_per_s']:7.1f} sent/s  "
                f"p50 {s['p50_ms']:7.1f}  p99 {s['p99_ms']:7.1f} ms  "
                f"failures {int(s.get('failures', 0))}  generator cpu "
                f"{cell.generator_cpu_share:.0%}  server "
                f"{cell.server_cpu_ms_per_request:.1f} CPU ms/request  {cell.status}"
            )
            cells.append(cell)
            bar.update()
    return cells, inproc


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    check_environment()  # what the locustfiles read, before anything starts
    exit_on_sigterm()

    texts = corpus.generate()
    args.reports_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    info = machine()
    log.info(f"==> bench on {info['cpu']} x{info['logical_cpus']}, corpus {corpus.describe(texts)}")
    inproc: list[dict[str, Any]] = []
    cells: list[Cell] = []
    with (
        tempfile.TemporaryDirectory(prefix="tritonforge-bench-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        workdir = Path(tmp)
        setup = start(stack, args)
        # On a terminal: a bar over every cell of every round, with its ETA.
        total = args.repeats * len(setup.plan) * len(args.concurrency)
        bar = stack.enter_context(Bar("bench", total, unit="cells"))
        for round_ in range(1, args.repeats + 1):
            log.info("==> round %d/%d", round_, args.repeats)
            round_cells, round_inproc = run_round(setup, args, texts, workdir, bar)
            cells += round_cells
            inproc += round_inproc
    write_report(args, info, started, texts, cells, inproc)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
