"""How a bench cell is measured: one bounded Locust or perf_analyzer run, the in-process limits,
and the CPU time and Triton statistics around it."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import platform
import resource
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tritonforge import tasks
from tritonforge.errors import ModelConfigError
from tritonforge.host import cpu_model
from tritonforge.loadtest.bench.cells import EMPTY_SUMMARY, OPENAI, Cell, Target, task_bench
from tritonforge.loadtest.discovered import encoder_onnx, text_tokenizer
from tritonforge.loadtest.locust.run import locust_command
from tritonforge.pipelines import Pipeline

log = logging.getLogger(__name__)


NO_SLO = ["--slo-p95-ms", "1e9", "--slo-p99-ms", "1e9", "--slo-min-rps", "0"]


NO_SLO += ["--slo-max-fail-ratio", "1"]


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = cpu_model()
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
    loadtest = tasks.get(target.task).module("loadtest")  # its LOCUSTFILE and users
    locustfile = loadtest.LOCUSTFILE
    if target.system == "fastapi":
        classes = [loadtest.FASTAPI_USER]
    else:
        protocol = target.protocol
        classes = [loadtest.OPENAI_USER] if protocol == OPENAI else loadtest.USERS[protocol]
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
    task: str = tasks.default().name,
    name: str = "",
) -> list[dict[str, Any]]:
    """Each in-process model (embedder or classifier of pipeline ``name``) at batch 1 and 16."""
    from tritonforge.loadtest.anchors.inprocess.embed import measure

    results = []
    what = f"{name} " if task_bench(task) is not None else ""
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
