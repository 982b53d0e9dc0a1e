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
import json
import logging
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tritonforge.client.discovery import choose, route
from tritonforge.client.errors import ClientError
from tritonforge.env import env_float, env_int
from tritonforge.errors import ModelConfigError
from tritonforge.loadtest import corpus
from tritonforge.loadtest.bench import classify as classify_bench
from tritonforge.loadtest.discovered import encoder_onnx, pipelines, text_tokenizer
from tritonforge.loadtest.locust import EMBED_LOCUSTFILE, LOCUST_DIR
from tritonforge.loadtest.locust.options import check_environment
from tritonforge.loadtest.locust.run import exit_on_sigterm, locust_command
from tritonforge.logs import run_main
from tritonforge.pipelines import Pipeline
from tritonforge.progress import Bar
from tritonforge.runtime.server import ADMIN_HEADER, free_port, serving

log = logging.getLogger(__name__)
NO_SLO = ["--slo-p95-ms", "1e9", "--slo-p99-ms", "1e9", "--slo-min-rps", "0"]
NO_SLO += ["--slo-max-fail-ratio", "1"]


GENERATORS = ("locust", "perf_analyzer")
OPENAI = "openai"  # a Locust "protocol": OpenAI's /v1/embeddings on the HTTP port (ensembles)
LOCUST_USERS = {"http": "TritonHttpUser", "grpc": "TritonGrpcUser", OPENAI: "OpenAIEmbeddingsUser"}


@dataclass(frozen=True)
class Target:
    """One served configuration to load, and the load generator that loads it."""

    system: str  # "triton" | "fastapi"
    protocol: str  # "http" | "grpc"
    pipeline: str = "-"  # the orchestration: "ensemble" | "bls"
    variant: str = "fp32"
    generator: str = "locust"  # "locust" | "perf_analyzer"
    name: str = ""  # the pipeline (discovered)
    model: str = ""
    parameters: tuple[tuple[str, str], ...] = ()
    task: str = "embedding"  # "classification": loadtest.bench.classify
    input_name: str = "text"  # the pipeline's text input (discovered)

    @property
    def label(self) -> str:
        gen = "pa" if self.generator == "perf_analyzer" else "locust"
        if self.task == classify_bench.TASK:
            if self.system == "fastapi":
                return f"fastapi+torch /predict {self.name}"
            return f"{self.name} {self.pipeline} {self.variant} {self.protocol}/{gen}"
        if self.system == "fastapi":
            return f"fastapi+torch http/{gen}"
        if self.protocol == OPENAI:
            return f"/v1/embeddings {self.variant} http/{gen}"
        return f"{self.pipeline} {self.variant} {self.protocol}/{gen}"


@dataclass
class Cell:
    """One measured (target, concurrency) run. ``status`` is "ok", or says what went wrong
    (a stalled or failed run is reported, never dropped)."""

    target: Target
    concurrency: int
    summary: dict[str, Any]
    exit_code: int
    status: str = "ok"
    generator_cpu_share: float = math.nan  # the generator's CPU time / (wall time x cores)
    server_stats: dict[str, dict[str, float]] = field(default_factory=dict)
    # Server CPU time per request (tritonserver + stubs + front): robust on a loaded machine, unlike
    # throughput; NaN against a server not started by the bench.
    server_cpu_ms_per_request: float = math.nan


EMPTY_SUMMARY: dict[str, Any] = {
    "requests": 0,
    "failures": 0,
    "sentences_per_s": math.nan,
    "p50_ms": math.nan,
    "p95_ms": math.nan,
    "p99_ms": math.nan,
}


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
    # Not `import locust`: it monkey-patches this whole process for gevent, which breaks the
    # embedded server's front (asyncio in a thread) that runs in this process.
    from importlib.metadata import version

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
        "locust": version("locust"),
        "load_average_at_start": os.getloadavg(),
    }


def tree_cpu_s(pid: int | None) -> float:
    """CPU seconds used so far by process ``pid`` and its descendants (tritonserver + stubs)."""
    import psutil

    if pid is None:
        return math.nan
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return math.nan
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def server_cpu_s(pid: int | None) -> float:
    """CPU seconds of an embedded server: tritonserver's tree plus this process, where the
    launcher's front runs (the bench itself only waits on its generator while a cell runs)."""
    if pid is None:
        return math.nan
    own = resource.getrusage(resource.RUSAGE_SELF)
    return tree_cpu_s(pid) + own.ru_utime + own.ru_stime


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _cpu_share(cpu_s: float, wall_s: float) -> float:
    return cpu_s / wall_s / (os.cpu_count() or 1) if wall_s > 0 else math.nan


def run_locust_cell(
    target: Target,
    concurrency: int,
    *,
    host: str,
    grpc_url: str,
    duration_s: float,
    warmup_s: float,
    workdir: Path,
    model_repository: Path | None = None,
) -> Cell:
    """One bounded Locust run; the summary comes from the exact samples after warm-up. The
    users discover the pipeline from ``model_repository`` (the bench's), else the server's configs."""
    samples = workdir / f"cell-{time.monotonic_ns()}.json"
    extra = [*NO_SLO, "--samples-out", str(samples), "--warmup-s", str(warmup_s)]
    if model_repository is not None:
        extra += ["--model-repository", str(model_repository)]
    if target.task == classify_bench.TASK:
        locustfile = classify_bench.LOCUSTFILE
        if target.system == "fastapi":
            classes = [classify_bench.FASTAPI_USER]
        else:
            classes = [classify_bench.USERS[target.protocol]]
            extra += ["--pipeline", target.pipeline, "--variant", target.variant]
            extra += ["--grpc-url", grpc_url, "--pipeline-name", target.name]
    elif target.system == "fastapi":
        locustfile, classes = EMBED_LOCUSTFILE, ["FastApiUser"]
    else:
        locustfile = EMBED_LOCUSTFILE
        classes = [LOCUST_USERS[target.protocol]]
        extra += ["--pipeline", target.pipeline, "--variant", target.variant]
        extra += ["--grpc-url", grpc_url, "--pipeline-name", target.name]
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
    status = "ok"
    cpu0, t0 = _children_cpu_s(), time.monotonic()
    for attempt in (1, 2):
        try:
            proc = subprocess.run(
                command, capture_output=True, text=True, check=False, timeout=limit_s
            )
            status = "ok" if attempt == 1 else "ok (after a stalled attempt)"
            break
        except subprocess.TimeoutExpired as e:
            log.warning("    locust exceeded %.0f s (attempt %d); killed", limit_s, attempt)
            proc = subprocess.CompletedProcess(
                command, -9, str(e.stdout or ""), str(e.stderr or "")
            )
            status = f"stalled twice (killed after {limit_s:.0f} s)"
            samples.unlink(missing_ok=True)
    share = _cpu_share(_children_cpu_s() - cpu0, time.monotonic() - t0)
    try:
        summary = {**EMPTY_SUMMARY, **json.loads(samples.read_text())}
    except (OSError, ValueError):
        log.error("locust wrote no samples:\n%s\n%s", proc.stdout[-2000:], proc.stderr[-4000:])
        summary = dict(EMPTY_SUMMARY)
        if status == "ok":
            status = f"failed (locust exit {proc.returncode}, no samples)"
    if status == "ok" and not summary.get("requests") and not summary.get("failures"):
        print(proc.stderr[-2000:], file=sys.stderr)
        status = f"failed (locust exit {proc.returncode}, no request sent)"
    return Cell(target, concurrency, summary, proc.returncode, status, share)


def run_perf_analyzer_cell(
    target: Target,
    concurrency: int,
    *,
    url: str,
    texts: Sequence[str],
    duration_s: float,
    workdir: Path,
    headers: dict[str, str],
) -> Cell:
    """One bounded perf_analyzer run (C++ client, far cheaper than Locust on 2 cores)."""
    from tritonforge.loadtest.perf_analyzer import tool as perf_analyzer

    model, parameters = target.model, dict(target.parameters)
    cpu0, t0 = _children_cpu_s(), time.monotonic()
    status = "ok"
    for attempt in (1, 2):  # a failed run (e.g. "no stable measurement") is tried once more
        try:
            r = perf_analyzer.measure(
                model=model, url=url, protocol=target.protocol, concurrency=concurrency,
                texts=texts, window_ms=max(1000, int(duration_s * 1000 / 2)), workdir=workdir,
                parameters=parameters, headers=headers, timeout_s=4 * duration_s + 60,
                input_name=target.input_name,
            )  # fmt: skip
            status = "ok" if attempt == 1 else "ok (after a failed attempt)"
            break
        except perf_analyzer.PerfAnalyzerError as e:
            status = f"failed: {_reason(str(e))}"
            log.warning("    perf_analyzer attempt %d: %s", attempt, status)
            if "not installed" in str(e):
                break
    share = _cpu_share(_children_cpu_s() - cpu0, time.monotonic() - t0)
    if status.startswith("failed"):
        return Cell(target, concurrency, dict(EMPTY_SUMMARY), 1, status, share)
    summary = {
        **EMPTY_SUMMARY,
        "requests": int(r.get("requests", 0)),
        "sentences_per_s": r["infer_per_s"],
        "p50_ms": r["p50_ms"],
        "p95_ms": r["p95_ms"],
        "p99_ms": r["p99_ms"],
    }
    return Cell(target, concurrency, summary, 0, status, share)


def _reason(message: str) -> str:
    """The line of a tool's output that says what went wrong (else its last line), shortened."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return "no output"
    named = [line for line in lines if "rror" in line or "ailed" in line or "stalled" in line]
    return (named[-1] if named else lines[-1])[:160]


def _wait_http(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as response:
            if response.status == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer within {timeout_s:.0f} s")


@contextlib.contextmanager
def baseline_service(
    module: str, ready_timeout_s: float = 120, args: Sequence[str] = ()
) -> Iterator[str]:
    """A baseline app (``python -m MODULE --host 127.0.0.1 --port P [args]``) in its own process,
    ready when ``/health`` answers 200; yields ``127.0.0.1:P``; terminated on exit."""
    port = free_port()
    command = [sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(port), *args]
    proc = subprocess.Popen(command, cwd=LOCUST_DIR.parents[2])
    try:
        _wait_http(f"http://127.0.0.1:{port}/health", ready_timeout_s)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def fastapi_service() -> Iterator[str]:
    """The embedding baseline (one uvicorn worker); yields its base URL."""
    with baseline_service("tritonforge.loadtest.anchors.fastapi.embed") as address:
        yield f"http://{address}"


def load_embedders(repo: Path, pipeline: Pipeline, variants: Sequence[str]) -> dict[str, Any]:
    """One in-process embedder per variant whose encoder is an exported ONNX file."""
    from tritonforge.loadtest.anchors.inprocess.embed import InProcessEmbedder

    embedders: dict[str, Any] = {}
    try:
        tokenizer = text_tokenizer(repo, pipeline)
    except ModelConfigError:
        log.warning("   (no tokenizer model of %r: in-process skipped)", pipeline.name)
        return embedders
    for variant in variants:
        onnx = encoder_onnx(repo, pipeline, variant)
        if onnx is None:
            log.warning("   (no ONNX %s encoder of %r: in-process skipped)", variant, pipeline.name)
            continue
        embedders[variant] = InProcessEmbedder(onnx, tokenizer)
    return embedders


def measure_inprocess(
    embedders: dict[str, Any],
    texts: Sequence[str],
    duration_s: float,
    task: str = "embedding",
    name: str = "",
) -> list[dict[str, Any]]:
    """Each in-process model (embedder or classifier of pipeline ``name``) at batch 1 and 16."""
    from tritonforge.loadtest.anchors.inprocess.embed import measure

    results = []
    what = f"{name} " if task == classify_bench.TASK else ""
    for variant, embedder in embedders.items():
        for batch in (1, 16):
            r = measure(embedder, texts, variant=variant, batch=batch, duration_s=duration_s)
            log.info(
                f"   in-process {what}{variant} batch {batch:2d}: {r.sentences_per_s:7.1f} sent/s  "
                f"p50 {r.p50_ms:6.1f} ms  p99 {r.p99_ms:6.1f} ms  "
                f"(padding {r.padded_token_share:.0%} of tokens)"
            )
            results.append({**r.as_dict(), "task": task, "name": name})
    return results


def _median(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return float(statistics.median(finite)) if finite else math.nan


def _median_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per numeric field, the median over repeats (counts are summed; a key missing from a
    round, e.g. a failed one, counts as NaN); other fields from the first."""
    out = dict(rows[0])
    keys = dict.fromkeys(k for r in rows for k in r)
    for key in keys:
        value = next((r[key] for r in rows if key in r), None)
        if key in ("batch", "concurrency") or isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            values = [float(r.get(key, math.nan)) for r in rows]
            if key in ("requests", "failures", "calls", "sentences"):
                out[key] = int(sum(v for v in values if not math.isnan(v)))
            else:
                out[key] = _median(values)
    out["repeats"] = len(rows)
    return out


def _sum_stats(parts: Sequence[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    total: dict[str, dict[str, float]] = {}
    for part in parts:
        for model, values in part.items():
            into = total.setdefault(model, {})
            for k, v in values.items():
                into[k] = into.get(k, 0.0) + v
    return total


def aggregate(
    cells: list[Cell], inproc: list[dict[str, Any]]
) -> tuple[list[Cell], list[dict[str, Any]]]:
    """Medians over the interleaved rounds, per (target, concurrency) and (variant, batch)."""
    by_cell: dict[tuple[Target, int], list[Cell]] = {}
    for c in cells:
        by_cell.setdefault((c.target, c.concurrency), []).append(c)
    merged = []
    for (t, conc), group in by_cell.items():
        bad = [c.status for c in group if c.status != "ok"]
        status = "ok" if not bad else f"{len(bad)}/{len(group)} rounds: {bad[0]}"
        merged.append(
            Cell(
                t,
                conc,
                _median_rows([c.summary for c in group]),
                max(c.exit_code for c in group),
                status,
                _median([c.generator_cpu_share for c in group]),
                _sum_stats([c.server_stats for c in group]),
                _median([c.server_cpu_ms_per_request for c in group]),
            )
        )
    by_ip: dict[tuple[str, str, str, int], list[dict[str, Any]]] = {}
    for r in inproc:
        by_ip.setdefault(_inproc_key(r), []).append(r)
    return merged, [_median_rows(group) for group in by_ip.values()]


def _inproc_key(r: dict[str, Any]) -> tuple[str, str, str, int]:
    return (r.get("task", "embedding"), r.get("name", ""), r["variant"], r["batch"])


def _ratio(a: float, b: float | None) -> float:
    if b is None or not b or math.isnan(b) or math.isnan(a):
        return math.nan
    return a / b


def _get(rows: list[dict[str, Any]], **want: Any) -> dict[str, Any] | None:
    for r in rows:
        if all(r.get(k) == v for k, v in want.items()):
            return r
    return None


def _verdict(ok: bool) -> str:
    return "MET   " if ok else "MISSED"  # NaN compares False: shown as MISSED with "nan"


def _target_lines(rows: list[dict[str, Any]], generator: str, protocol: str) -> list[str]:
    """The issue's targets for one (generator, protocol) pair of Triton rows."""
    tag = f"{protocol}/{'pa' if generator == 'perf_analyzer' else 'locust'}"

    def at(pipeline: str, variant: str, conc: int) -> dict[str, Any] | None:
        return _get(
            rows, system="triton", pipeline=pipeline, variant=variant, protocol=protocol,
            generator=generator, concurrency=conc,
        )  # fmt: skip

    lines = []
    concs = sorted({r["concurrency"] for r in rows if r["system"] == "triton"})
    top = max(concs, default=16)
    for variant in dict.fromkeys(r["variant"] for r in rows if r["system"] == "triton"):
        for conc in concs:
            bls, ens = at("bls", variant, conc), at("ensemble", variant, conc)
            if bls is None or ens is None:
                continue
            xb = _ratio(bls["sentences_per_s"], ens["sentences_per_s"])
            xp = _ratio(bls["p99_ms"], ens["p99_ms"])
            lines.append(
                f"{_verdict(xb >= 0.9 and xp <= 1.2)} BLS {variant} {tag} @{conc}: "
                f"{xb:.2f}x the ensemble's throughput (target >= 0.90x), p99 {xp:.2f}x "
                "(target <= 1.20x)"
            )
    fp32 = at("ensemble", "fp32", top)
    if fp32 is None:
        return lines
    xf = fp32["x_fastapi_p99"]
    if not math.isnan(xf):
        lines.append(
            f"{_verdict(xf <= 0.5)} fp32 ensemble {tag} @{top}: p99 {xf:.2f}x FastAPI's "
            f"(target <= 0.5x; throughput {fp32['x_fastapi_throughput']:.2f}x)"
        )
    int8 = at("ensemble", "int8", top)
    if int8 is not None:
        xi = _ratio(int8["sentences_per_s"], fp32["sentences_per_s"])
        lines.append(
            f"{_verdict(xi >= 1.5)} int8 ensemble {tag} @{top}: {xi:.2f}x fp32 served "
            "(target >= 1.5x)"
        )
    return lines


ONE_CLIENT_P50_BUDGET_MS = 2.0
"""Issue 20 item 2: a lone request may cost at most this much more than the in-process limit."""
LIMIT_RATIO, MOONSHOT_RATIO = 0.9, 1.0
"""Issue 20 item 2: the top concurrency's throughput against the in-process batch-1 limit."""


def limit_lines(rows: list[dict[str, Any]], generator: str, protocol: str) -> list[str]:
    """Issue 20 item 2 for every text pipeline (embedding and classification) the rows hold:
    the fp32 ensemble at 1 client, p50 <= in-process batch-1 p50 + 2 ms; at the top concurrency,
    throughput >= 0.9x the in-process batch-1 limit (moonshot >= 1.0x). Each line: met/missed
    and the ratio."""
    tag = f"{protocol}/{'pa' if generator == 'perf_analyzer' else 'locust'}"
    mine = [
        r for r in rows
        if r["system"] == "triton" and r["pipeline"] == "ensemble" and r["variant"] == "fp32"
        and r["generator"] == generator and r["protocol"] == protocol
    ]  # fmt: skip
    lines = []
    for task, name in dict.fromkeys((r["task"], r["name"]) for r in mine):
        cells = {r["concurrency"]: r for r in mine if (r["task"], r["name"]) == (task, name)}
        what = "fp32 ensemble" if task == "embedding" else f"{name} ensemble fp32"
        one = cells.get(1)
        if one is not None:
            d = one["p50_minus_inprocess_ms"]
            lines.append(
                f"{_verdict(d <= ONE_CLIENT_P50_BUDGET_MS)} {what} {tag} @1: p50 "
                f"{one['p50_ms']:.1f} ms = in-process batch-1 p50 {d:+.1f} ms "
                f"(target <= +{ONE_CLIENT_P50_BUDGET_MS:g} ms; ratio "
                f"{_ratio(one['p50_ms'], one['p50_ms'] - d):.2f}x)"
            )
        top = max(cells)
        if top > 1:
            x = cells[top]["x_inprocess_throughput"]
            moon = "moonshot met" if x >= MOONSHOT_RATIO else "moonshot missed"
            lines.append(
                f"{_verdict(x >= LIMIT_RATIO)} {what} {tag} @{top}: {x:.2f}x the in-process "
                f"batch-1 limit (target >= {LIMIT_RATIO:.2f}x, {moon}: >= {MOONSHOT_RATIO:.1f}x)"
            )
    return lines


def analyse(
    cells: list[Cell], inproc: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows with ratios, and the issue's targets as lines ``MET``/``MISSED`` with the numbers.

    Ratios: served throughput / in-process batch-1 throughput and served p50 - in-process batch-1
    p50 (same variant); throughput and p99 against FastAPI at the same concurrency, measured by
    the same generator (Locust over HTTP).
    """
    best = {_inproc_key(r): r for r in inproc}
    fastapi = {
        (c.target.task, c.target.name, c.concurrency): c.summary
        for c in cells
        if c.target.system == "fastapi"
    }
    rows = []
    for c in cells:
        s = c.summary
        t = c.target
        ip1 = best.get((t.task, t.name, t.variant, 1))
        fa = fastapi.get((t.task, t.name, c.concurrency)) if t.generator == "locust" else None
        rows.append(
            {
                **asdict(c.target),
                "label": c.target.label,
                "concurrency": c.concurrency,
                **s,
                "status": c.status,
                "generator_cpu_share": c.generator_cpu_share,
                "server_stats": c.server_stats,
                "server_cpu_ms_per_request": c.server_cpu_ms_per_request,
                "x_inprocess_throughput": _ratio(
                    s["sentences_per_s"], ip1["sentences_per_s"] if ip1 else None
                ),
                "p50_minus_inprocess_ms": s["p50_ms"] - ip1["p50_ms"] if ip1 else math.nan,
                "x_fastapi_throughput": _ratio(
                    s["sentences_per_s"], fa["sentences_per_s"] if fa else None
                ),
                "x_fastapi_p99": _ratio(s["p99_ms"], fa["p99_ms"] if fa else None),
            }
        )
    combos = dict.fromkeys((r["generator"], r["protocol"]) for r in rows if r["system"] == "triton")
    embedding = [r for r in rows if r["task"] == "embedding"]
    lines = [line for gen, protocol in combos for line in _target_lines(embedding, gen, protocol)]
    lines += [line for gen, protocol in combos for line in limit_lines(rows, gen, protocol)]
    return rows, lines + classify_bench.ratio_lines(rows)


def _inproc_label(r: dict[str, Any]) -> str:
    what = f"{r['name']} " if r.get("task") == classify_bench.TASK else ""
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

            def ms(key: str, v: dict[str, float] = v) -> float:
                return v.get(f"{key}_ns", 0.0) / max(1.0, v.get(f"{key}_count", 0.0)) / 1e6

            out.append(
                f"    {model:<22} {int(n):6d} inferences in {int(ex):6d} executions "
                f"(batch {n / max(ex, 1):4.2f})  queue {ms('queue'):7.2f} ms  "
                f"compute in {ms('compute_input'):5.2f} infer {ms('compute_infer'):6.2f} "
                f"out {ms('compute_output'):5.2f} ms"
            )
    return "\n".join(out)


STAT_KEYS = ("queue", "compute_input", "compute_infer", "compute_output")


def model_stats(http: str, headers: dict[str, str]) -> dict[str, dict[str, float]]:
    """Triton's cumulative per-model statistics (a restricted API: the admin header is sent)."""
    request = urllib.request.Request(f"http://{http}/v2/models/stats", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            data = json.loads(response.read())
    except (OSError, ValueError):
        return {}
    out: dict[str, dict[str, float]] = {}
    for m in data.get("model_stats", []):
        inf = m.get("inference_stats", {})
        values = {
            "inference_count": float(m.get("inference_count", 0)),
            "execution_count": float(m.get("execution_count", 0)),
        }
        for key in STAT_KEYS:
            values[f"{key}_ns"] = float(inf.get(key, {}).get("ns", 0))
            values[f"{key}_count"] = float(inf.get(key, {}).get("count", 0))
        out[m["name"]] = values
    return out


def stats_delta(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    """Per model, what a cell added to the cumulative statistics (models it did not touch: none)."""
    return {
        model: {k: v - before.get(model, {}).get(k, 0.0) for k, v in values.items()}
        for model, values in after.items()
        if values.get("inference_count", 0) > before.get(model, {}).get("inference_count", 0)
    }


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
    ax_l.set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def targets_from(args: argparse.Namespace, pipeline: Pipeline) -> list[Target]:
    """Triton targets: each orchestration x variant of ``pipeline`` (those it serves), over each
    generator's protocols (Locust, the FastAPI baselines' generator, and perf_analyzer, for
    embedding and classification alike: issue 20 item 2 measures both over gRPC)."""
    out = []
    generators = [("locust", args.locust_protocols), ("perf_analyzer", args.pa_protocols)]
    for generator, protocols in generators:
        for orchestration in args.pipelines:
            for variant in args.variants:
                try:
                    model, parameters = route(pipeline, orchestration, variant)
                except ClientError as e:
                    log.warning("   (%s: skipped)", e)
                    continue
                for protocol in protocols:
                    if protocol == OPENAI and (
                        generator != "locust"
                        or orchestration != "ensemble"
                        or pipeline.task != "embedding"
                    ):
                        continue  # /v1 serves embedding ensembles only
                    out.append(
                        Target(
                            "triton",
                            protocol,
                            orchestration,
                            variant,
                            generator,
                            pipeline.name,
                            model,
                            tuple(parameters.items()),
                            pipeline.task,
                            pipeline.input,
                        )
                    )
    return out


def classify_pipelines(args: argparse.Namespace) -> list[Pipeline]:
    """Every classification pipeline of ``--model-repository`` (discovered)."""
    found = pipelines(args.model_repository).values()
    return [p for p in found if p.task == classify_bench.TASK]


def start_predict_service(
    stack: contextlib.ExitStack, args: argparse.Namespace, pipeline: Pipeline
) -> str:
    """The FastAPI /predict baseline of ``pipeline`` (its verified checkpoint); "" when none."""
    baseline, why = classify_bench.baseline_for(
        args.model_repository, pipeline, args.classify_checkpoint
    )
    if baseline is None:
        log.warning("   (no FastAPI /predict baseline for %r: %s)", pipeline.name, why)
        return ""
    log.info("==> starting FastAPI /predict (PyTorch eager) for %r", pipeline.name)
    module, service_args = classify_bench.FASTAPI_MODULE, baseline.service_args()
    address = stack.enter_context(baseline_service(module, args=service_args))
    return f"http://{address}"


def bench_pipeline(args: argparse.Namespace) -> Pipeline:
    """The embedding pipeline to measure (``--pipeline-name``, else the default), discovered from
    ``--model-repository`` (the served one, or a copy of a running server's)."""
    return choose(pipelines(args.model_repository), "embedding", args.pipeline_name)


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
    args = parser.parse_args(argv)
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
        # Everything is started first and measured in interleaved rounds, so that a noisy
        # neighbour on a shared machine hits every target alike (medians over --repeats rounds).
        plan: list[Target] = []
        fastapi_urls: dict[tuple[str, str], str] = {}
        # --skip-embedding: no embedding pipeline is needed (a repository of classifiers only)
        pipeline = None if args.skip_embedding else bench_pipeline(args)
        classifiers = [] if args.skip_classify else classify_pipelines(args)
        if not args.skip_fastapi:
            log.info("==> starting FastAPI + uvicorn (1 worker) + PyTorch eager")
            if pipeline is not None:
                embedding_baseline = stack.enter_context(fastapi_service())
                fastapi_urls[("embedding", pipeline.name)] = embedding_baseline
                plan.append(Target("fastapi", "http", name=pipeline.name))
            for cp in classifiers:
                url = start_predict_service(stack, args, cp)
                if url:
                    fastapi_urls[(cp.task, cp.name)] = url
                    plan.append(Target("fastapi", "http", name=cp.name, task=cp.task))
        targets = [] if pipeline is None else targets_from(args, pipeline)
        for cp in classifiers:
            targets += targets_from(args, cp)
        http = grpc = ""
        headers: dict[str, str] = {}
        server_pid: int | None = None
        if targets:
            if args.url:
                http = args.url.removeprefix("http://")
                grpc = args.grpc_url or f"{http.rsplit(':', 1)[0]}:8001"
                key = os.environ.get("TRITONFORGE_ADMIN_KEY")
                headers = {ADMIN_HEADER: key} if key else {}
                log.info("==> Triton at %s / %s", http, grpc)
            else:
                log.info("==> starting the embedded Triton on %s", args.model_repository)
                server = stack.enter_context(serving(args.model_repository))
                http, grpc, headers = server.http_url, server.grpc_url, server.admin_headers
                server_pid = server.pid
            plan += targets
        if any(t.generator == "perf_analyzer" for t in plan):
            from tritonforge.loadtest.perf_analyzer import tool as perf_analyzer

            if perf_analyzer.binary() is None:
                log.warning(
                    "   perf_analyzer is not installed (python -m tritonforge.loadtest.perf_analyzer.tool install): "
                    "its cells are reported as failed"
                )
        embedders = (
            {}
            if args.skip_inprocess or pipeline is None
            else load_embedders(args.model_repository, pipeline, args.variants)
        )
        in_process_classifiers = {
            cp.name: classify_bench.load_classifiers(args.model_repository, cp, args.variants)
            for cp in ([] if args.skip_inprocess else classifiers)
        }
        warned = False
        # On a terminal: a bar over every cell of every round, with its ETA.
        total = args.repeats * len(plan) * len(args.concurrency)
        bar = stack.enter_context(Bar("bench", total, unit="cells"))
        for round_ in range(1, args.repeats + 1):
            log.info("==> round %d/%d", round_, args.repeats)
            if pipeline is not None:
                inproc += measure_inprocess(embedders, texts, args.inprocess_s, name=pipeline.name)
            for name, models in in_process_classifiers.items():
                task = classify_bench.TASK
                inproc += measure_inprocess(models, texts, args.inprocess_s, task, name)
            for target in plan:
                for conc in args.concurrency:
                    before = model_stats(http, headers) if target.system == "triton" else {}
                    cpu_before = server_cpu_s(server_pid)
                    if target.system == "triton" and not before and not warned:
                        warned = True
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
                            fastapi_urls[(target.task, target.name)]
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
                        used = server_cpu_s(server_pid) - cpu_before
                        cell.server_cpu_ms_per_request = (
                            used * 1000 / served if served else math.nan
                        )
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
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
