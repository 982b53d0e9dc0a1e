"""``python -m tritonforge.loadtest.reliability.soak`` (``make soak``): a bounded leak soak against the embedded Triton.

After a warm-up, ``--concurrency`` workers send the corpus through every discovered pipeline (its
ensembles and its BLS, every variant each serves), gRPC and HTTP alternately, for ``--duration-s``. Every ``--sample-s`` it records the RSS of
tritonserver and of each Python stub and the bytes of the server's ``/dev/shm`` regions. The run
fails (exit 1) when any process grows by ``--max-growth-mb`` or more per 10k requests over the
second half of the window after warm-up (a leak is sustained; an arena that extends once is not), or when shared memory has not returned to its post-warm-up baseline once the load stops.
Prints the curve and writes JSON (+ PNG) under ``--reports-dir``.
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import psutil

from tritonforge import tasks
from tritonforge.client.sync import EmbeddingClient
from tritonforge.loadtest.corpus import generate
from tritonforge.logs import run_main
from tritonforge.pipelines import Pipeline, from_repository
from tritonforge.progress import Bar
from tritonforge.runtime.launcher.settings import ServerSettings
from tritonforge.runtime.serving import EmbeddedServer

MB = 1024 * 1024
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Route:
    """One way in: a pipeline through an orchestration with a variant."""

    pipeline: Pipeline
    orchestration: str
    variant: str


def routes(server: EmbeddedServer) -> list[Route]:
    """Every (pipeline, ensemble|bls, variant) the served repository declares (discovered)."""
    out = []
    for p in from_repository(Path(server.settings.model_repository)).values():
        out += [Route(p, "ensemble", v) for v in p.variants]
        out += [Route(p, "bls", v) for v in p.bls_variants if p.bls]
    return out


def send(client: EmbeddingClient, route: Route, texts: list[str]) -> None:
    """One call through ``route`` (embed or classify, by the pipeline's task)."""
    call = getattr(client, tasks.get(route.pipeline.task).client_call)
    call(texts, variant=route.variant, pipeline=route.orchestration, name=route.pipeline.name)


@dataclass
class Sample:
    elapsed_s: float
    requests: int
    failures: int
    rss_mb: dict[str, float]
    shm_mb: float


@dataclass
class SoakResult:
    samples: list[Sample] = field(default_factory=list)
    growth_mb_per_10k: dict[str, float] = field(default_factory=dict)
    whole_window_mb_per_10k: dict[str, float] = field(default_factory=dict)
    shm_baseline_mb: float = 0.0
    shm_after_mb: float = 0.0
    breaches: list[str] = field(default_factory=list)


def measure(server: EmbeddedServer) -> tuple[dict[str, float], float]:
    """RSS (MB) of tritonserver and each stub (by model instance), and shm bytes (MB)."""
    rss: dict[str, float] = {}
    if server.pid is not None:
        rss["tritonserver"] = psutil.Process(server.pid).memory_info().rss / MB
    for name, pid in server.stub_pids().items():
        try:
            rss[name] = psutil.Process(pid).memory_info().rss / MB
        except psutil.NoSuchProcess:
            rss[name] = float("nan")
    shm = sum(p.stat().st_size for p in server.shm_regions() if p.exists()) / MB
    return rss, shm


class Traffic:
    """Bounded worker threads; each owns its client (tritonclient's HTTP client is per thread)."""

    def __init__(self, server: EmbeddedServer, concurrency: int, texts: Sequence[str]) -> None:
        self.server, self.texts = server, list(texts)
        self.routes = routes(server)
        self.repository = str(server.settings.model_repository)
        self.requests = self.failures = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._work, args=(i,), daemon=True) for i in range(concurrency)
        ]

    def _work(self, worker: int) -> None:
        protocol = "grpc" if worker % 2 == 0 else "http"
        url = self.server.grpc_url if protocol == "grpc" else self.server.http_url
        client = EmbeddingClient(url, protocol, timeout_s=30, repository=self.repository)
        i = worker
        while not self._stop.is_set():
            batch = [self.texts[(i + k) % len(self.texts)] for k in range(1 + i % 4)]
            # every pipeline, orchestration and variant in turn, so every stub sees traffic
            ok = True
            try:
                send(client, self.routes[i % len(self.routes)], batch)
            except Exception:  # counted; the soak is about memory, failures are reported
                ok = False
            with self._lock:
                self.requests += 1
                self.failures += 0 if ok else 1
            i += 1
        client.close()

    def run_until(self, requests: int | None = None, deadline_s: float | None = None) -> None:
        start = time.monotonic()
        while True:
            if requests is not None and self.requests >= requests:
                return
            if deadline_s is not None and time.monotonic() - start >= deadline_s:
                return
            time.sleep(0.1)

    def start(self) -> Traffic:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)


def warm_up_peak(server: EmbeddedServer, longest: str, rows: int = 64) -> None:
    """Send max-batch requests of max-length text through every pipeline and variant, so that
    allocator arenas (ONNX Runtime, PyTorch) grow to their peak before measuring starts: their
    one-time growth is not a leak."""
    text = " ".join([longest] * 4)  # longer than max_length: truncated to it
    repository = str(server.settings.model_repository)
    with EmbeddingClient(
        server.grpc_url, "grpc", timeout_s=120, batch_size=rows, repository=repository
    ) as client:
        for route in routes(server):
            send(client, route, [text] * min(rows, route.pipeline.max_items))


def growth_per_10k(requests: Sequence[int], rss_mb: Sequence[float]) -> float:
    """Least-squares slope of RSS over requests, in MB per 10k requests (robust to sampling noise;
    a one-off arena step early in the run counts once, not extrapolated from two points)."""
    x = np.asarray(requests, dtype=np.float64)
    y = np.asarray(rss_mb, dtype=np.float64)
    if len(x) < 2 or np.ptp(x) == 0 or not np.all(np.isfinite(y)):
        return float("inf") if not np.all(np.isfinite(y)) else 0.0
    slope = np.polyfit(x, y, 1)[0]
    return float(slope * 10_000)


def soak(
    server: EmbeddedServer,
    duration_s: float,
    warmup_requests: int,
    concurrency: int,
    sample_s: float,
    max_growth_mb: float,
) -> SoakResult:
    result = SoakResult()
    texts = generate(size=512)
    log.info("==> warm-up: the largest shapes first (memory arenas reach their peak), then traffic")
    warm_up_peak(server, max(texts, key=len))
    traffic = Traffic(server, concurrency, texts).start()
    log.info("==> warm-up: %d requests", warmup_requests)
    traffic.run_until(requests=warmup_requests)
    t0 = time.monotonic()
    base_requests = traffic.requests
    rss0, shm0 = measure(server)
    result.shm_baseline_mb = shm0
    result.samples.append(Sample(0.0, 0, traffic.failures, rss0, shm0))
    log.info(
        f"{'t_s':>6} {'requests':>9} {'fail':>5} {'shm_MB':>7}  "
        + " ".join(f"{n[:18]:>18}" for n in rss0)
    )
    # On a terminal: a bar over the soak window with its ETA (the sample lines print above it).
    bar = Bar("soak", round(duration_s), unit="s", leave=False)
    while time.monotonic() - t0 < duration_s:
        traffic.run_until(deadline_s=min(sample_s, duration_s - (time.monotonic() - t0)))
        rss, shm = measure(server)
        sample = Sample(
            time.monotonic() - t0, traffic.requests - base_requests, traffic.failures, rss, shm
        )
        result.samples.append(sample)
        line = f"{sample.elapsed_s:6.0f} {sample.requests:9d} {sample.failures:5d} {shm:7.1f}  "
        line += " ".join(f"{rss.get(n, float('nan')):18.1f}" for n in rss0)
        log.info("%s", line)
        bar.update_to(round(sample.elapsed_s))
    bar.close()
    traffic.stop()
    time.sleep(2.0)
    _, result.shm_after_mb = measure(server)
    # A leak grows steadily; an allocator arena that extends once (a step) does not. The gate is
    # the slope over the second half of the window; the whole-window slope is reported beside it.
    tail = result.samples[len(result.samples) // 2 :]
    for name in rss0:
        whole = growth_per_10k(
            [s.requests for s in result.samples],
            [s.rss_mb.get(name, float("nan")) for s in result.samples],
        )
        growth = growth_per_10k(
            [s.requests for s in tail], [s.rss_mb.get(name, float("nan")) for s in tail]
        )
        result.growth_mb_per_10k[name] = round(growth, 3)
        result.whole_window_mb_per_10k[name] = round(whole, 3)
        if not growth < max_growth_mb:
            result.breaches.append(
                f"{name}: RSS grew {growth:.2f} MB per 10k requests (limit {max_growth_mb})"
            )
    if result.shm_after_mb > result.shm_baseline_mb + 0.5:
        result.breaches.append(
            f"/dev/shm did not return to its baseline: {result.shm_after_mb:.1f} MB vs "
            f"{result.shm_baseline_mb:.1f} MB"
        )
    return result


def write_reports(result: SoakResult, reports_dir: Path) -> None:
    reports_dir.mkdir(parents=True, exist_ok=True)
    (reports_dir / "soak.json").write_text(
        json.dumps({**asdict(result), "samples": [asdict(s) for s in result.samples]}, indent=2)
    )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the JSON is the record; the chart is a convenience
        return
    fig, ax = plt.subplots(figsize=(9, 5))
    xs = [s.requests for s in result.samples]
    for name in result.samples[0].rss_mb:
        ax.plot(xs, [s.rss_mb.get(name, float("nan")) for s in result.samples], label=name)
    ax.set_xlabel("requests after warm-up")
    ax.set_ylabel("RSS (MB)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(reports_dir / "soak.png", dpi=100)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tritonforge.loadtest.reliability.soak", description=__doc__
    )
    p.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    p.add_argument("--duration-s", type=float, default=600.0)
    p.add_argument("--warmup-requests", type=int, default=1000, help="covers the corpus' lengths")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--sample-s", type=float, default=30.0)
    p.add_argument("--max-growth-mb", type=float, default=5.0, help="per 10k requests")
    p.add_argument("--reports-dir", type=Path, default=Path("reports"))
    args = p.parse_args(argv)
    server = EmbeddedServer(ServerSettings.ephemeral(args.model_repository))
    log.info("==> starting the embedded Triton on %s", args.model_repository)
    server.start()
    try:
        server.wait_ready()
        result = soak(
            server,
            args.duration_s,
            args.warmup_requests,
            args.concurrency,
            args.sample_s,
            args.max_growth_mb,
        )
    finally:
        server.stop()
    write_reports(result, args.reports_dir)
    print("growth, second half (MB per 10k requests):", json.dumps(result.growth_mb_per_10k))
    print("growth, whole window (MB per 10k requests):", json.dumps(result.whole_window_mb_per_10k))
    print(f"shm: baseline {result.shm_baseline_mb:.1f} MB, after {result.shm_after_mb:.1f} MB")
    for breach in result.breaches:
        print(f"SOAK FAILED: {breach}")
    if not result.breaches:
        print(f"soak passed: {result.samples[-1].requests} requests, no leak above the limits")
    return 1 if result.breaches else 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
