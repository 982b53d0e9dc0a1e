"""Generation benchmark: streams at 1, 4 and 16 concurrent clients through

1. the in-process limit: the served engine (ONNX Runtime decoder + in-flight scheduler) called
   directly, no server;
2. the usual alternative: FastAPI + transformers ``generate`` with a streamer, one thread per
   request (:mod:`loadtest.anchors.fastapi.generate`);
3. our decoupled ``generate`` model on the embedded Triton (gRPC streams), and the same model
   through the front's OpenAI-compatible ``/v1/chat/completions`` (``stream: true``, SSE).

Per cell: aggregate output tokens/s, time to first token (p50/p99), inter-token latency (p50),
request latency (p50/p99). Ratios are printed against the targets of issue 13, and everything is
written to ``reports/bench_generate.json``. ``python -m tritonforge.loadtest.bench.generate [--quick]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tritonforge.loadtest.bench.generate_cells import (
    Cell,
    Timing,
    chunk_tokens,
    median_cells,
    token_gaps_ms,
)
from tritonforge.loadtest.bench.services import baseline_service
from tritonforge.loadtest.errors import StreamError
from tritonforge.logs import run_main
from tritonforge.modelconfig import ModelConfig
from tritonforge.progress import Bar
from tritonforge.runtime.launcher.settings import ServerSettings
from tritonforge.runtime.serving import EmbeddedServer

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
PROMPTS = (
    "Write a short story about a robot learning to paint.",
    "Explain how a bicycle works.",
    "Describe your ideal weekend in detail.",
    "What are the benefits of reading books?",
    "Tell me about the history of the printing press.",
    "How do airplanes stay in the air?",
    "Give me advice for a job interview.",
    "Describe the water cycle.",
)


StreamFn = Callable[[str, int], Iterator[str]]
"""``(prompt, max_tokens) -> chunks``: one streamed request."""


def tagged(prompt: str, tag: str, client: int, request: int) -> str:
    """``prompt`` as :func:`run_cell` sends it under ``tag`` (a user text no request repeats)."""
    return f"{prompt} (request {tag}.{client}.{request})"


def run_cell(
    target: str,
    stream: StreamFn,
    count_tokens: Callable[[str], int],
    concurrency: int,
    requests_per_client: int,
    max_tokens: int,
    texts: dict[str, str] | None = None,
    tag: str | None = None,
) -> Cell:
    """``concurrency`` closed-loop clients, each sending ``requests_per_client`` streams
    (``texts``: filled with each prompt's first complete output, by prompt). ``tag``: each
    request's user text ends with ``(request <tag>.<client>.<request>)``, so no request repeats
    an earlier one (only the chat template's shared start can come from a prompt cache)."""
    timings: list[Timing] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        for r in range(requests_per_client):
            prompt = PROMPTS[(k + r * concurrency) % len(PROMPTS)]
            sent = prompt if tag is None else tagged(prompt, tag, k, r)
            t = Timing()
            start = time.perf_counter()
            text = []
            try:
                for chunk in stream(sent, max_tokens):
                    now = time.perf_counter() - start
                    if chunk:
                        t.chunk_s.append(now)
                        text.append(chunk)
                t.end_s = time.perf_counter() - start
                t.first_s = t.chunk_s[0] if t.chunk_s else t.end_s
                t.tokens = count_tokens("".join(text))
                t.chunk_tokens = chunk_tokens(text, count_tokens)
                if texts is not None:
                    with lock:
                        texts.setdefault(prompt, "".join(text))
            except Exception as e:  # a failed request counts; the bench goes on
                t.error = f"{type(e).__name__}: {e}"
            with lock:
                timings.append(t)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(concurrency)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    window = time.perf_counter() - t0
    ok = [t for t in timings if t.error is None]
    itl = [(t.end_s - t.first_s) / (t.tokens - 1) * 1000 for t in ok if t.tokens > 1]
    gaps = [(b - a) * 1000 for t in ok for a, b in zip(t.chunk_s, t.chunk_s[1:], strict=False)]
    per_token = [g for t in ok for g in token_gaps_ms(t.chunk_s, t.chunk_tokens)]

    def pct(values: Sequence[float], q: float) -> float:
        return float(np.percentile(values, q)) if values else float("nan")

    return Cell(
        target=target,
        concurrency=concurrency,
        requests=len(timings),
        failures=len(timings) - len(ok),
        window_s=window,
        tokens_per_s=sum(t.tokens for t in ok) / window,
        ttft_p50_ms=pct([t.first_s * 1000 for t in ok], 50),
        ttft_p99_ms=pct([t.first_s * 1000 for t in ok], 99),
        itl_p50_ms=pct(itl, 50),
        latency_p50_ms=pct([t.end_s * 1000 for t in ok], 50),
        latency_p99_ms=pct([t.end_s * 1000 for t in ok], 99),
        itl_p99_ms=pct(per_token, 99),
        chunk_gap_p99_ms=pct(gaps, 99),
    )


# -- targets ----------------------------------------------------------------------------------
def inprocess_target(model_dir: Path) -> tuple[StreamFn, Any, float]:
    """The engine without a server: ``(stream, engine, prefill_ms)`` where ``prefill_ms`` is the
    median time of one prompt's prefill (the floor of time to first token)."""

    from tritonforge.generate_engine import GenerateEngine

    config = ModelConfig.from_pbtxt((model_dir / "config.pbtxt").read_text())
    engine = GenerateEngine(config, model_dir / "1")
    engine.warmup("Hello")
    ids = np.asarray([engine.prompt_ids(PROMPTS[0], True)], np.int64)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        engine.decoder(
            ids, np.ones_like(ids), np.arange(ids.shape[1])[None], engine.decoder.empty_past()
        )
        times.append(time.perf_counter() - t)
    engine.start()
    return engine_stream(engine), engine, float(np.median(times) * 1000)


def engine_stream(engine: Any) -> Callable[[str, int], Iterator[str]]:
    """``(prompt, max_tokens) -> text chunks`` generated in process by a started ``engine``
    (a ``GenerateEngine``), the last chunk the one with a finish reason."""
    import queue

    def stream(prompt: str, max_tokens: int) -> Iterator[str]:
        chunks: queue.Queue[tuple[str, bool]] = queue.Queue()
        seq = engine.build(
            prompt,
            {"max_tokens": max_tokens},
            on_output=lambda _, text, reason: chunks.put((text, reason is not None)),
            on_error=lambda _, e: chunks.put((f"error: {e}", True)),
        )
        engine.scheduler.submit(seq)
        while True:
            text, final = chunks.get(timeout=300)
            yield text
            if final:
                return

    return stream


def client_stream(
    url: str, protocol: str, timeout_s: float = 300, model: str | None = None
) -> StreamFn:
    from tritonforge.client.generate import DEFAULT_MODEL, GenerateClient

    c = GenerateClient(url, protocol=protocol, timeout_s=timeout_s, model=model or DEFAULT_MODEL)

    def stream(prompt: str, max_tokens: int) -> Iterator[str]:
        yield from (chunk.text for chunk in c.stream(prompt, max_tokens=max_tokens))

    return stream


def has_chat_template(model_dir: Path) -> bool:
    """Whether the served decoder renders chats (its ``generation.json`` holds a template); one
    without (a base model) answers ``/v1/completions`` only."""
    meta = json.loads((model_dir / "1" / "generation.json").read_text())
    return bool(meta.get("chat_template"))


def openai_stream(url: str, model: str, chat: bool = True, timeout_s: float = 300) -> StreamFn:
    """Chat completions (or, ``chat=False``, completions) streamed from ``/v1`` (the key from
    $TRITONFORGE_OPENAI_API_KEY)."""
    import requests

    key = os.environ.get("TRITONFORGE_OPENAI_API_KEY") or "none"
    route = "chat/completions" if chat else "completions"

    def stream(prompt: str, max_tokens: int) -> Iterator[str]:
        body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": True}
        if chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        with requests.post(
            f"http://{url}/v1/{route}",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
            stream=True,
            timeout=timeout_s,
        ) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith(b"data: {"):
                    event = json.loads(line[6:])
                    if "error" in event:
                        raise StreamError(str(event["error"]))
                    for choice in event.get("choices", []):
                        text = (choice.get("delta") or {}).get("content") or choice.get("text")
                        if text:
                            yield text

    return stream


@contextlib.contextmanager
def fastapi_generate_service() -> Iterator[str]:
    """The FastAPI + transformers baseline in its own process; yields its host:port."""
    with baseline_service(
        "tritonforge.loadtest.anchors.fastapi.generate", ready_timeout_s=300
    ) as a:
        yield a


def print_table(cells: Sequence[Cell]) -> None:
    head = (
        f"{'target':<22}{'conc':>5}{'req':>5}{'fail':>5}{'tok/s':>9}{'ttft p50':>10}"
        f"{'ttft p99':>10}{'itl p50':>9}{'itl p99':>9}{'lat p50':>10}{'lat p99':>10}"
    )
    print(head)
    print("-" * len(head))
    for c in cells:
        print(
            f"{c.target:<22}{c.concurrency:>5}{c.requests:>5}{c.failures:>5}"
            f"{c.tokens_per_s:>9.1f}{c.ttft_p50_ms:>10.0f}{c.ttft_p99_ms:>10.0f}"
            f"{c.itl_p50_ms:>9.0f}{c.itl_p99_ms:>9.0f}{c.latency_p50_ms:>10.0f}"
            f"{c.latency_p99_ms:>10.0f}"
        )


def targets(
    cells: Sequence[Cell], prefill_ms: float, top: int, served: str = "triton"
) -> list[dict[str, Any]]:
    """The issue's three targets, each with its measured ratio and whether it is met
    (``served``: the label of the served default variant's cells)."""
    by = {(c.target if c.target != served else "triton", c.concurrency): c for c in cells}
    out = []

    def add(name: str, value: float, goal: float, higher: bool) -> None:
        met = value >= goal if higher else value <= goal
        out.append({"target": name, "value": round(value, 3), "goal": goal, "met": bool(met)})

    tri1, tri_top = by.get(("triton", 1)), by.get(("triton", top))
    fast_top = by.get(("fastapi", top))
    if tri1 and tri_top:
        add(
            f"triton tokens/s at {top} / at 1 (>=)",
            tri_top.tokens_per_s / tri1.tokens_per_s,
            4.0,
            True,
        )
        add(
            "triton TTFT p50 at 1 / in-process prefill (<=)",
            tri1.ttft_p50_ms / prefill_ms,
            1.5,
            False,
        )
    if tri_top and fast_top:
        add(
            f"triton / fastapi tokens/s at {top} (>=)",
            tri_top.tokens_per_s / fast_top.tokens_per_s,
            2.0,
            True,
        )
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tritonforge.loadtest.bench.generate", description=__doc__
    )
    p.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--requests-per-client", type=int, default=2)
    p.add_argument(
        "--skip", nargs="*", default=[], choices=["inprocess", "fastapi", "triton", "triton-v1"]
    )
    p.add_argument(
        "--variants",
        nargs="*",
        help="served decoder variants to measure (default: every exported one, interleaved)",
    )
    p.add_argument(
        "--rounds", type=int, default=1, help="interleaved rounds of the served cells (medians)"
    )
    p.add_argument("--out", type=Path, default=Path("reports/bench_generate.json"))
    return p


@dataclass
class Measure:
    """Measures a target at every ``--concurrency`` (after a warm-up) into :attr:`cells`."""

    args: argparse.Namespace
    count: Callable[[str], int]
    bar: Bar
    cells: list[Cell] = field(default_factory=list)

    def __call__(self, target: str, stream: StreamFn, rnd: int = 0) -> None:
        args = self.args
        for _ in stream(PROMPTS[0], 4):  # warm-up (first-call costs are not measured)
            pass
        for c in args.concurrency:
            cell = run_cell(
                target, stream, self.count, c, args.requests_per_client, args.max_tokens
            )
            cell.round = rnd
            log.info(
                f"    {target} x{c}: {cell.tokens_per_s:.1f} tokens/s, TTFT p50 {cell.ttft_p50_ms:.0f} ms"
            )
            self.cells.append(cell)
            self.bar.update()


def _measure_served(
    args: argparse.Namespace, measure: Measure, group: Any, variants: list[str], model_dir: Path
) -> None:
    """The served variants over gRPC (interleaved rounds) and ``/v1`` on one embedded server."""
    models = [group.model(v) for v in variants]
    settings = ServerSettings.ephemeral(
        args.model_repository, model_control_mode="explicit", load_models=models
    )
    server = EmbeddedServer(settings)
    server.start()
    try:
        server.wait_ready()
        # Interleaved: every round measures every variant, so a load swing on the shared
        # machine hits both alike.
        for rnd in range(args.rounds if "triton" not in args.skip else 0):
            for v, model in zip(variants, models, strict=True):
                measure(f"triton {v}", client_stream(server.grpc_url, "grpc", model=model), rnd)
        if "triton-v1" not in args.skip:
            chat = has_chat_template(model_dir)
            measure("triton-v1", openai_stream(server.http_url, model_dir.name, chat))
    finally:
        server.stop()


def _measure_all(
    args: argparse.Namespace, measure: Measure, group: Any, variants: list[str], model_dir: Path
) -> float:
    """Every target not ``--skip``ped; the in-process prefill ms (NaN when not measured)."""
    prefill_ms = float("nan")
    if "inprocess" not in args.skip or "triton" not in args.skip:
        stream, engine, prefill_ms = inprocess_target(model_dir)
        log.info(
            f"    in-process prefill of a {len(engine.prompt_ids(PROMPTS[0], True))}-token prompt: {prefill_ms:.1f} ms"
        )
        if "inprocess" not in args.skip:
            measure("inprocess", stream)
        engine.close()
    if "fastapi" not in args.skip:
        with fastapi_generate_service() as url:
            measure("fastapi", client_stream(url, "http"))
    if "triton" not in args.skip or "triton-v1" not in args.skip:
        _measure_served(args, measure, group, variants, model_dir)
    return prefill_ms


def _print_report(
    args: argparse.Namespace, cells: list[Cell], variants: list[str], goals: list[dict[str, Any]]
) -> None:
    print()
    print_table(cells)
    by = {(c.target, c.concurrency): c for c in cells}
    for v in variants:
        for c in args.concurrency:
            base, other = by.get(("triton fp32", c)), by.get((f"triton {v}", c))
            if v != "fp32" and base and other:
                print(
                    f"  triton {v} / fp32 tokens/s at {c}: {other.tokens_per_s / base.tokens_per_s:.2f}x"
                )
    print()
    for g in goals:
        print(f"  {'MET ' if g['met'] else 'MISS'} {g['target']}: {g['value']} (goal {g['goal']})")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from tritonforge.pipelines import generator_from_repository

    group = generator_from_repository(args.model_repository)
    variants = args.variants or list(group.variants)
    model_dir = args.model_repository / group.model()
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "1" / "tokenizer.json"))

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    load = os.getloadavg()
    log.info(f"==> [bench generate] load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    # On a terminal: a bar over every cell (target x concurrency), with its ETA.
    measured = [t for t in ("inprocess", "fastapi") if t not in args.skip]
    served_cells = 0 if "triton" in args.skip else len(variants) * args.rounds
    served_cells += 0 if "triton-v1" in args.skip else 1
    bar = Bar(
        "bench generate", (len(measured) + served_cells) * len(args.concurrency), unit="cells"
    )
    measure = Measure(args, count, bar)
    prefill_ms = _measure_all(args, measure, group, variants, model_dir)
    bar.close()
    cells = median_cells(measure.cells)
    goals = targets(
        cells, prefill_ms, max(args.concurrency), served=f"triton {group.default_variant}"
    )
    _print_report(args, cells, variants, goals)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "load_average": load,
                "load_average_end": os.getloadavg(),
                "variants": {v: group.model(v) for v in variants},
                "default_variant": group.default_variant,
                "rounds": args.rounds,
                "max_tokens": args.max_tokens,
                "prefill_ms": prefill_ms,
                "cells": [asdict(c) for c in cells],
                "targets": goals,
            },
            indent=2,
        )
        + "\n"
    )
    log.info("==> wrote %s", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
