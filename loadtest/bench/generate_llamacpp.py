"""Served generation vs llama.cpp, side by side (the generation section of ``make bench``). One run, interleaved rounds (every round measures every target, so a load swing on the shared
machine hits all alike), the same 8 prompts rendered through the chat template and sent as the
same token ids, greedy, ``--max-tokens`` new tokens:

- our served decoders (every exported ``generate`` variant) over gRPC streams, served by
  ``tritonforge serve`` in its own process (as llama-server runs), not in the bench's;
- ``llama-server`` (built by :mod:`tritonforge.loadtest.anchors.llamacpp`), f32 and q8_0 GGUFs of the
  same dequantized checkpoint, ``--parallel 16`` slots, continuous batching, 2 threads, started
  here on free ports; ``ignore_eos`` so it always emits ``--max-tokens`` tokens; its prompt
  cache on (``cache_prompt``), as ours is (``prefix_cache_entries``);
- ONNX Runtime GenAI in-process (single stream only: the ceiling), EOS suppressed likewise.

Token counts: our decoders stop at EOS, so each row reports its tokens per request; the bench
says whether every row emitted the same count (``same_token_counts``). Tokens are counted by
re-tokenizing the streamed text with our tokenizer on every side. Per cell: decode tok/s (one
stream: 1000 / median inter-token ms, from each request's tokens over its time after the first),
aggregate tok/s, TTFT p50, p99 inter-token latency (a chunk of k tokens after g ms: k of g / k).
Beside each row: greedy agreement with our fp32 output (mean common-prefix fraction of its
tokens, and identical outputs; each prompt's first output in round 0, 1 stream first: fp32 is
batch-invariant, so its reference is its alone output) and held-out perplexity where computable. Ratios vs
llama.cpp q8_0, each target marked met/missed; JSON + PNG into ``build/``. Without a llama.cpp
build the section says so and reports ours.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tritonforge.loadtest.anchors import llamacpp, ortgenai
from tritonforge.loadtest.bench.generate import (
    PROMPTS,
    Cell,
    StreamFn,
    client_stream,
    median_cells,
    run_cell,
    tagged,
)
from tritonforge.loadtest.bench.generate_causes import StepTimes, cause, measure
from tritonforge.loadtest.bench.generate_cells import chart, decode_tok_s, value
from tritonforge.loadtest.bench.serve_process import start_serve
from tritonforge.logs import run_main
from tritonforge.prefix_cache import common_length

# named, not __name__: run as `python -m` that is __main__, which logging leaves at warning
log = logging.getLogger("tritonforge.loadtest.bench.generate_llamacpp")

ANCHOR = "llama.cpp q8_0"
REFERENCE = "triton fp32"  # greedy agreement is against this row's outputs


@dataclass(frozen=True)
class Goal:
    """``ours.<field> / anchor.<field>`` at ``concurrency`` against ``goal``."""

    name: str
    concurrency: int
    field: str
    goal: float
    higher_is_better: bool


GOALS = (
    Goal("single-stream decode tok/s >= 1.0x", 1, "decode_tok_s", 1.0, True),
    Goal("8 streams aggregate tok/s >= 1.5x", 8, "tokens_per_s", 1.5, True),
    Goal("16 streams aggregate tok/s >= 1.5x", 16, "tokens_per_s", 1.5, True),
    Goal("16 streams TTFT p50 <= 0.8x", 16, "ttft_p50_ms", 0.8, False),
    Goal("16 streams inter-token p99 <= 1.0x", 16, "itl_p99_ms", 1.0, False),  # tokens per gap
)


def evaluate(cells: Sequence[Cell], ours: str, anchor: str = ANCHOR) -> list[dict[str, Any]]:
    """Every goal for row ``ours`` against row ``anchor``: the ratio and met/missed (``met``
    None when either cell is missing, e.g. llama.cpp not built)."""
    by = {(c.target, c.concurrency): c for c in cells}
    out = []
    for g in GOALS:
        mine, theirs = by.get((ours, g.concurrency)), by.get((anchor, g.concurrency))
        row: dict[str, Any] = {"target": f"{ours}: {g.name} {anchor}", "goal": g.goal}
        if mine is None or theirs is None:
            out.append({**row, "ratio": None, "met": None})
            continue
        a, b = value(mine, g.field), value(theirs, g.field)
        ratio = a / b if b > 0 else float("nan")
        met = ratio >= g.goal if g.higher_is_better else ratio <= g.goal
        out.append({**row, "ours": a, "anchor": b, "ratio": round(ratio, 3), "met": bool(met)})
    return out


def agreement(reference: Sequence[int], other: Sequence[int]) -> float:
    """Fraction of ``reference``'s tokens that ``other`` reproduces before the first difference."""
    n = 0
    for a, b in zip(reference, other, strict=False):
        if a != b:
            break
        n += 1
    return n / len(reference) if reference else float("nan")


def llamacpp_stream(url: str, prompt_ids: Callable[[str], list[int]]) -> StreamFn:
    """``/completion`` streamed (SSE): the prompt as token ids, greedy, EOS ignored, prompt cache
    on (ours has one too)."""
    import requests

    def stream(prompt: str, max_tokens: int) -> Iterator[str]:
        body: dict[str, Any] = {
            "prompt": prompt_ids(prompt),
            "n_predict": max_tokens,
            "temperature": 0,
            "top_k": 1,
            "ignore_eos": True,
            "cache_prompt": True,
            "stream": True,
        }
        with requests.post(f"http://{url}/completion", json=body, stream=True, timeout=300) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith(b"data: "):
                    event = json.loads(line[6:])
                    yield str(event.get("content", ""))
                    if event.get("stop"):
                        return

    return stream


def genai_stream(
    model: ortgenai.GenAIModel, prompt_ids: Callable[[str], list[int]], decode: Any
) -> StreamFn:
    """In-process GenAI greedy stream, text per token (``decode``: our incremental detokenizer)."""

    def stream(prompt: str, max_tokens: int) -> Iterator[str]:
        ids: list[int] = []
        sent = ""
        for token in model.stream_ids(prompt_ids(prompt), max_tokens):
            ids.append(token)
            text = decode(ids)
            if not text.endswith("\ufffd"):
                yield text[len(sent) :]
                sent = text

    return stream


@dataclass
class Target:
    label: str
    stream: StreamFn
    concurrency: tuple[int, ...]
    perplexity: float | None = None
    note: str = ""


def print_table(cells: Sequence[Cell], quality: dict[str, dict[str, Any]]) -> None:
    head = (
        f"{'target':<20}{'streams':>8}{'decode tok/s':>13}{'agg tok/s':>10}{'TTFT p50':>9}"
        f"{'ITL p99':>8}{'tok/req':>8}{'agree':>7}{'same':>6}{'ppl':>7}"
    )
    print(head)
    print("-" * len(head))
    for c in sorted(cells, key=lambda c: (c.target, c.concurrency)):
        q = quality.get(c.target, {})
        ppl = q.get("perplexity")
        print(
            f"{c.target:<20}{c.concurrency:>8}{decode_tok_s(c):>13.1f}{c.tokens_per_s:>10.1f}"
            f"{c.ttft_p50_ms:>9.0f}{c.itl_p99_ms:>8.0f}{q.get('tokens_per_request', 0):>8.1f}"
            f"{q.get('agreement', float('nan')):>7.3f}{q.get('identical', '-')!s:>6}"
            f"{ppl if ppl is None else round(ppl, 2)!s:>7}"
        )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tritonforge.loadtest.bench.generate_llamacpp", description=__doc__
    )
    p.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    p.add_argument("--build-dir", type=Path, default=Path("build"), help="llama.cpp, GenAI")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 16])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--single-requests", type=int, default=len(PROMPTS), help="at 1 stream")
    # 3: the first round of a freshly started llama-server ran 5-10x slow here twice (2026-12-02)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variants", nargs="*", help="served decoder variants (default: all)")
    p.add_argument("--no-llamacpp", action="store_true", help="skip llama.cpp even when built")
    p.add_argument("--no-genai", action="store_true", help="skip ONNX Runtime GenAI")
    p.add_argument("--fresh-prompts", action="store_true", help="no request repeats another")
    p.add_argument("--llamacpp-poll", type=int, default=0, help="llama-server --poll (0-100)")
    p.add_argument("--genai-precisions", nargs="*", default=list(ortgenai.PRECISIONS))
    p.add_argument(
        "--out", type=Path, default=None, help="JSON (default build/bench_llamacpp.json)"
    )
    return p


def _triton_targets(
    args: argparse.Namespace,
    group: Any,
    variants: Sequence[str],
    servers: list[Any],
    report_ppl: dict[str, float],
) -> list[Target]:
    """Every served variant on one ``tritonforge serve`` process of its own, as llama-server is
    (:mod:`tritonforge.loadtest.bench.serve_process`; appended to ``servers`` to stop)."""
    models = {v: group.model(v) for v in variants}
    log_path = args.build_dir / "bench_llamacpp_serve.log"
    served = start_serve(args.model_repository, list(models.values()), log_path)
    servers.append(served.process)
    out = []
    for v, model in models.items():
        stream = client_stream(served.grpc_url, "grpc", model=model)
        out.append(Target(f"triton {v}", stream, tuple(args.concurrency), report_ppl.get(v)))
    return out


def _llamacpp_targets(
    args: argparse.Namespace,
    layout: llamacpp.Layout,
    notes: list[str],
    servers: list[Any],
    prompt_ids: Callable[[str], list[int]],
) -> list[Target]:
    """A llama-server per quantization when llama.cpp is built (each appended to ``servers``);
    why not in ``notes`` otherwise."""
    if args.no_llamacpp:
        notes.append("llama.cpp: skipped (--no-llamacpp)")
        return []
    if not layout.built():
        notes.append(
            f"llama.cpp: not built under {layout.home} (run `make llamacpp`); "
            f"ratios vs {ANCHOR} not computed"
        )
        return []
    out = []
    for quant in llamacpp.QUANTS:
        srv = llamacpp.LlamaServer(
            layout, quant, parallel=max(16, *args.concurrency), poll=args.llamacpp_poll
        )
        try:
            srv.start()
        except llamacpp.LlamaCppError as e:
            notes.append(f"llama.cpp {quant}: could not start: {e}")
            continue
        servers.append(srv)
        out.append(
            Target(
                f"llama.cpp {quant}",
                llamacpp_stream(srv.url, prompt_ids),
                tuple(args.concurrency),
                note="perplexity not computed (llama-perplexity is not built)",
            )
        )
    return out


def _print_report(
    cells: list[Cell],
    quality: dict[str, Any],
    notes: list[str],
    steps: dict[str, StepTimes],
    fresh_prompts: bool,
) -> list[dict[str, Any]]:
    """Print the notes, the table and the goals of each served variant (of ``steps``), each
    with its measured cause (:mod:`tritonforge.loadtest.bench.generate_causes`); the goals."""
    print()
    for n in notes:
        print(f"  note: {n}")
    print_table(cells, quality)
    goals: list[dict[str, Any]] = []
    for v, times in steps.items():
        for g, spec in zip(evaluate(cells, f"triton {v}"), GOALS, strict=True):
            if g["met"] is not None:
                figures = (spec.goal, g["ours"], g["anchor"], times, fresh_prompts)
                g["cause"] = cause(spec.field, spec.concurrency, *figures)
            goals.append(g)
    print()
    for g in goals:
        mark = {True: "MET ", False: "MISS", None: "n/a "}[g["met"]]
        print(f"  {mark} {g['target']}: {g['ratio']} (goal {g['goal']})")
        if "cause" in g:
            print(f"         cause: {g['cause']}")
    return goals


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = args.out or args.build_dir / "bench_llamacpp.json"
    from tokenizers import Tokenizer

    from tritonforge.generation import render_prompt
    from tritonforge.pipelines import generator_from_repository

    group = generator_from_repository(args.model_repository)
    variants = args.variants or list(group.variants)
    model_dir = args.model_repository / group.model()
    version = model_dir / "1"
    tokenizer = Tokenizer.from_file(str(version / "tokenizer.json"))
    meta = json.loads((version / "generation.json").read_text())

    def prompt_ids(text: str) -> list[int]:
        rendered = render_prompt(text, meta.get("chat_template"), True)
        return list(tokenizer.encode(rendered, add_special_tokens=False).ids)

    def ids(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False).ids)

    def count(text: str) -> int:
        return len(ids(text))

    load = os.getloadavg()
    log.info(f"==> [bench llama.cpp] load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    layout = llamacpp.Layout(args.build_dir)
    notes: list[str] = []
    servers: list[Any] = []
    report_ppl = _export_perplexity(args.model_repository, group, variants)
    # each goal's cause: our step alone, timed before any server runs (past: a prompt and half
    # the new tokens; tail: a fresh prompt's tokens after the prompts' shared start)
    first, second = prompt_ids(PROMPTS[0]), prompt_ids(PROMPTS[1])
    past = len(first) + args.max_tokens // 2
    tail = len(prompt_ids(tagged(PROMPTS[0], "0.16", 0, 0))) - common_length(first, second)
    steps = {
        v: measure(args.model_repository / group.model(v), args.concurrency, past, tail)
        for v in variants
    }
    t_start = time.perf_counter()
    try:
        targets = _triton_targets(args, group, variants, servers, report_ppl)
        targets += _llamacpp_targets(args, layout, notes, servers, prompt_ids)
        targets += _genai_targets(args, layout, notes, prompt_ids, tokenizer)
        texts: dict[str, dict[str, str]] = {}
        out.parent.mkdir(parents=True, exist_ok=True)
        cells = _interleaved(args, targets, count, texts, out.with_suffix(".rounds.json"))
    finally:
        for srv in reversed(servers):
            srv.stop()
    quality = _quality(targets, texts, ids, count)
    cells = median_cells(cells)
    goals = _print_report(cells, quality, notes, steps, args.fresh_prompts)
    counts = {q["tokens_per_request"] for q in quality.values() if q.get("tokens_per_request")}
    report = {
        "load_average": load,
        "load_average_end": os.getloadavg(),
        "elapsed_s": time.perf_counter() - t_start,
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        "prompts": list(PROMPTS),
        "fresh_prompts": args.fresh_prompts,
        "steps": {v: asdict(t) for v, t in steps.items()},
        "llamacpp_built": layout.built(),
        "notes": notes,
        "same_token_counts": len(counts) <= 1,
        "cells": [{**asdict(c), "decode_tok_s": decode_tok_s(c)} for c in cells],
        "quality": quality,
        "goals": goals,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=float) + "\n")
    chart(cells, out.with_suffix(".png"))
    log.info("==> wrote %s and %s", out, out.with_suffix(".png"))
    return 0


def _export_perplexity(repo: Path, group: Any, variants: Sequence[str]) -> dict[str, float]:
    """Held-out perplexity per served variant, from the export report (the gate's numbers)."""
    out: dict[str, float] = {}
    for v in variants:
        path = repo / group.model(v) / "1" / "export_report.json"
        if not path.is_file():
            continue
        ppl = json.loads(path.read_text()).get("quantization", {}).get("perplexity", {})
        key = "fp32" if v == "fp32" else v
        if key in ppl:
            out[v] = float(ppl[key])
    return out


def _genai_targets(
    args: argparse.Namespace,
    layout: llamacpp.Layout,
    notes: list[str],
    prompt_ids: Callable[[str], list[int]],
    tokenizer: Any,
) -> list[Target]:
    if args.no_genai or 1 not in args.concurrency:
        return []
    if not ortgenai.available():
        notes.append("ONNX Runtime GenAI: not installed (pip install -e '.[bench]')")
        return []
    if not (layout.checkpoint / "config.json").is_file():
        notes.append(f"ONNX Runtime GenAI: no checkpoint {layout.checkpoint} (make llamacpp)")
        return []
    from tritonforge.export.specs.smollm2 import smollm2_spec
    from tritonforge.export.specs.text_inputs import read_sentences

    spec = smollm2_spec()
    rows = [tokenizer.encode(t).ids for t in read_sentences(spec.perplexity_file)]
    out = []
    for precision in args.genai_precisions:
        try:
            path = ortgenai.build(layout.checkpoint, args.build_dir, precision)
            model = ortgenai.GenAIModel(path)
            ppl: float | None = model.perplexity(rows)
        except ortgenai.OrtGenAIError as e:
            notes.append(str(e))
            continue
        except Exception as e:  # perplexity needs all-position logits; say so
            notes.append(f"ONNX Runtime GenAI {precision} perplexity: {type(e).__name__}: {e}")
            ppl = None
        decode = lambda t: tokenizer.decode(t, skip_special_tokens=True)  # noqa: E731
        out.append(
            Target(f"ortgenai {precision}", genai_stream(model, prompt_ids, decode), (1,), ppl)
        )
    return out


def _interleaved(
    args: argparse.Namespace,
    targets: Sequence[Target],
    count: Callable[[str], int],
    texts: dict[str, dict[str, str]],
    partial: Path | None = None,
) -> list[Cell]:
    """Warm every target up, then ``rounds`` rounds over every (target, concurrency); the first
    output of each prompt in round 0 (lowest concurrency first) goes into
    ``texts[label][prompt]``."""
    cells: list[Cell] = []
    for t in targets:  # warm-up (first-call costs are not measured)
        for _ in t.stream(PROMPTS[0], 4):
            pass
    for rnd in range(args.rounds):
        for t in targets:
            for c in t.concurrency:
                collect = texts.setdefault(t.label, {}) if rnd == 0 else None
                per_client = args.single_requests if c == 1 else 1
                tag = f"{rnd}.{c}" if args.fresh_prompts else None  # the same for every target
                cell = run_cell(
                    t.label, t.stream, count, c, per_client, args.max_tokens, collect, tag
                )
                cell.round = rnd
                log.info(
                    f"    round {rnd} {t.label} x{c}: {cell.tokens_per_s:.1f} tok/s aggregate, "
                    f"decode {decode_tok_s(cell):.1f} tok/s, TTFT p50 {cell.ttft_p50_ms:.0f} ms"
                    f" (load {os.getloadavg()[0]:.1f})"
                )
                cells.append(cell)
        if partial is not None:  # what a cut-short run still leaves
            partial.write_text(json.dumps([asdict(c) for c in cells], indent=1) + "\n")
    return cells


def _quality(
    targets: Sequence[Target],
    texts: dict[str, dict[str, str]],
    ids: Callable[[str], list[int]],
    count: Callable[[str], int],
) -> dict[str, dict[str, Any]]:
    """Per target: tokens per request at 1 stream, agreement with :data:`REFERENCE`, perplexity."""
    ref = texts.get(REFERENCE, {})
    out: dict[str, dict[str, Any]] = {}
    for t in targets:
        mine = texts.get(t.label, {})
        shared = [p for p in mine if p in ref]
        agree = [agreement(ids(ref[p]), ids(mine[p])) for p in shared]
        out[t.label] = {
            "tokens_per_request": float(np.mean([count(x) for x in mine.values()]))
            if mine
            else 0.0,
            "agreement": float(np.mean(agree)) if agree else float("nan"),
            "identical": f"{sum(ids(ref[p]) == ids(mine[p]) for p in shared)}/{len(shared)}",
            "perplexity": t.perplexity,
            "note": t.note,
            "outputs": mine,
        }
    return out


if __name__ == "__main__":
    raise SystemExit(run_main(main))
