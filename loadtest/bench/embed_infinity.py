"""``embed`` vs Infinity, side by side (issue 35 item 4; the embedding peer section of ``make bench``).

The same all-MiniLM-L6-v2 directory on both sides: our exported ``embed`` ensemble (fp32) served
by ``tritonforge serve`` in a process of its own, over HTTP through the typed client, and
``infinity_emb`` (torch engine, CPU, its own venv: :mod:`tritonforge.loadtest.anchors.infinity`)
over its OpenAI-style ``/embeddings``.
The same corpus (:func:`tritonforge.loadtest.corpus.generate`), one text per request, closed
loop at each concurrency, interleaved rounds (every round measures every cell, so a load swing on
a shared machine hits both alike); per cell the median over rounds of texts/s and p50 / p99
latency, and the ratio ours / Infinity. Before timing, both embed the same texts and their
cosine is printed (the same model must give the same vectors). JSON into ``build/``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tritonforge.loadtest import corpus
from tritonforge.loadtest.anchors import infinity
from tritonforge.logs import run_main

log = logging.getLogger("tritonforge.loadtest.bench.embed_infinity")

OURS, ANCHOR = "triton embed fp32", "infinity torch"
EmbedFn = Callable[[Sequence[str]], Any]


@dataclass(frozen=True)
class Cell:
    target: str
    concurrency: int
    requests: int
    texts_s: float
    p50_ms: float
    p99_ms: float


def run_cell(
    target: str,
    make_embed: Callable[[], EmbedFn],
    texts: Sequence[str],
    concurrency: int,
    requests: int,
) -> Cell:
    """``requests`` one-text requests from ``concurrency`` threads, each with its own client
    made by ``make_embed`` in that thread (tritonclient's HTTP client is bound to its thread),
    texts taken in corpus order; texts/s over the wall time and latencies."""
    latencies: list[float] = []
    lock = threading.Lock()
    counter = iter(range(requests))
    errors: list[BaseException] = []
    ready = threading.Barrier(concurrency + 1)

    def worker() -> None:
        try:
            embed = make_embed()
        except Exception as e:  # any failure: re-raised after the cell
            errors.append(e)
            ready.abort()
            return
        try:
            ready.wait()
            while not errors:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                t0 = time.perf_counter()
                embed([texts[i % len(texts)]])
                with lock:
                    latencies.append(time.perf_counter() - t0)
        except threading.BrokenBarrierError:
            return  # another thread's client failed: reported from there
        except Exception as e:  # any failure: re-raised after the cell
            errors.append(e)
        finally:
            close = getattr(embed, "close", None)
            if close is not None:
                close()

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    with contextlib.suppress(threading.BrokenBarrierError):
        ready.wait()  # clients made: the clock starts
    start = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise errors[0]
    ms = np.asarray(latencies) * 1000
    return Cell(
        target,
        concurrency,
        len(latencies),
        len(latencies) / wall,
        float(np.percentile(ms, 50)),
        float(np.percentile(ms, 99)),
    )


def median_cells(cells: Sequence[Cell]) -> list[Cell]:
    """One cell per (target, concurrency): the median of each figure over the rounds."""
    groups: dict[tuple[str, int], list[Cell]] = {}
    for c in cells:
        groups.setdefault((c.target, c.concurrency), []).append(c)
    return [
        Cell(
            t,
            conc,
            int(np.median([c.requests for c in g])),
            float(np.median([c.texts_s for c in g])),
            float(np.median([c.p50_ms for c in g])),
            float(np.median([c.p99_ms for c in g])),
        )
        for (t, conc), g in groups.items()
    ]


def ratios(cells: Sequence[Cell]) -> list[dict[str, Any]]:
    """Per concurrency: ours / Infinity for throughput and p50 latency (None without both)."""
    by = {(c.target, c.concurrency): c for c in cells}
    out = []
    for conc in sorted({c.concurrency for c in cells}):
        ours, peer = by.get((OURS, conc)), by.get((ANCHOR, conc))
        out.append(
            {
                "concurrency": conc,
                "throughput_ratio": ours.texts_s / peer.texts_s if ours and peer else None,
                "p50_ratio": ours.p50_ms / peer.p50_ms if ours and peer else None,
            }
        )
    return out


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return np.asarray((a * b).sum(axis=1))


def format_table(cells: Sequence[Cell]) -> str:
    rows = [f"{'target':<20} {'conc':>4} {'texts/s':>9} {'p50 ms':>8} {'p99 ms':>8}"]
    for c in sorted(cells, key=lambda c: (c.concurrency, c.target)):
        rows.append(
            f"{c.target:<20} {c.concurrency:>4} {c.texts_s:>9.1f} {c.p50_ms:>8.1f} {c.p99_ms:>8.1f}"
        )
    for r in ratios(cells):
        if r["throughput_ratio"] is not None:
            rows.append(
                f"ours / Infinity @{r['concurrency']}: throughput {r['throughput_ratio']:.2f}x, "
                f"p50 latency {r['p50_ratio']:.2f}x"
            )
    return "\n".join(rows)


def _ours(repository: Path, build_dir: Path, stack: Any) -> tuple[EmbedFn, Callable[[], EmbedFn]]:
    """Serve the fp32 ``embed`` ensemble and what it calls from ``tritonforge serve``, a process
    of its own as Infinity's server is (:mod:`tritonforge.loadtest.bench.serve_process`: in the
    bench's process the front would share one interpreter lock with the client threads)."""
    from tritonforge import tasks
    from tritonforge.client.sync import EmbeddingClient
    from tritonforge.loadtest.bench.serve_process import start_serve
    from tritonforge.pipelines import from_repository
    from tritonforge.runtime.cli.staged import calls

    # the peer speaks OpenAI's embeddings API: ours is the pipeline served on /v1/embeddings
    pipeline = next(
        p for p in from_repository(repository).values() if tasks.get(p.task).openai_embeddings
    )
    ensemble = pipeline.model("fp32")
    log_path = build_dir / "bench_infinity_serve.log"
    served = start_serve(repository, [*calls(repository, ensemble), ensemble], log_path)
    stack.callback(served.process.stop)

    class Ours:
        def __init__(self) -> None:
            self.client = EmbeddingClient(
                served.http_url, "http", timeout_s=60, admin_key=served.admin_key
            )

        def __call__(self, texts: Sequence[str]) -> np.ndarray:
            return self.client.embed(list(texts), variant="fp32", name=pipeline.name)

        def close(self) -> None:
            self.client.close()

    return Ours(), Ours


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tritonforge.loadtest.bench.embed_infinity", description=__doc__
    )
    p.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    p.add_argument("--build-dir", type=Path, default=Path("build"))
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--requests", type=int, default=200, help="one-text requests per cell")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    layout = infinity.Layout(args.build_dir)
    texts = corpus.generate()
    log.info("==> embed vs Infinity on corpus %s", corpus.describe(texts))
    with contextlib.ExitStack() as stack:
        ours, make_ours = _ours(args.model_repository, args.build_dir, stack)
        targets: dict[str, Callable[[], EmbedFn]] = {OURS: make_ours}
        agreement = None
        if layout.installed():
            peer = stack.enter_context(infinity.server(layout))
            targets[ANCHOR] = lambda: peer.embed
            sample = list(texts[:32])
            cos = cosines(np.asarray(ours(sample)), np.asarray(peer.embed(sample)))
            agreement = {"texts": len(sample), "min_cosine": float(cos.min())}
            log.info("    same texts, same model: min cosine ours vs Infinity %.6f", cos.min())
        else:
            log.warning("    Infinity is not installed (`make infinity`): ours only")
        cells = []
        for rnd in range(args.rounds):
            for conc in args.concurrency:
                for name, make in targets.items():
                    cell = run_cell(name, make, texts, conc, args.requests)
                    log.info("    round %d %s @%d: %.1f texts/s", rnd, name, conc, cell.texts_s)
                    cells.append(cell)
    final = median_cells(cells)
    load = os.getloadavg()
    print(format_table(final), flush=True)
    print(f"(load average at the end {load[0]:.2f}; medians of {args.rounds} rounds)", flush=True)
    out = args.out or args.build_dir / "bench_infinity.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "cells": [asdict(c) for c in final],
                "rounds": [asdict(c) for c in cells],
                "ratios": ratios(final),
                "agreement": agreement,
                "infinity": list(infinity.PINS),
                "load_average_end": load[0],
            },
            indent=1,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
