"""Chunked prefill, measured before kept (issue #35 item 1): the served engine in-process
(``GenerateEngine``: the generate model's scheduler, decoder and stream interval, no Triton),
the same engine for every setting of ``prefill_chunk_tokens`` (set on its scheduler between
cells), rounds interleaved (every round measures every setting, so a load swing on the shared
machine hits all alike), the bench's prompts and cells (``loadtest.bench.generate.run_cell``:
closed-loop streams arriving together, TTFT p50, inter-token p99 counted per token, aggregate).

First the decoder itself: each prompt's last logits prefilled whole vs in chunks (batch 1,
each chunk after the cache of the ones before: the scheduler's calls), max abs difference and
whether the greedy token agrees; then every setting's greedy texts are compared with whole
prefills' (token-identical output is the requirement).

``python -m tritonforge.tasks.generation.loadtest.chunked_prefill --model-repository
model_repository --chunks 0 16 32 64`` writes ``build/chunked_prefill.json``; the numbers are
recorded in docs/performance.md ("Chunked prefill").
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from tritonforge.logs import run_main
from tritonforge.prefill_plan import (
    check_chunk_tokens,
    check_stall_row_tokens,
    chunk_end,
    chunk_inputs,
)

log = logging.getLogger("tritonforge.tasks.generation.loadtest.chunked_prefill")


def logits_check(engine: Any, prompts: Sequence[str], chunks: Sequence[int]) -> dict[str, Any]:
    """Max abs difference of each prompt's last logits, whole vs chunked, per chunk size, and
    how many greedy first tokens differ."""
    decoder, out = engine.decoder, {}
    for n in [c for c in chunks if c]:
        worst, flips = 0.0, 0
        for text in prompts:
            ids = engine.prompt_ids(text, True)
            whole, _ = decoder(*chunk_inputs(ids, 0, len(ids)), decoder.empty_past())
            done, past = 0, decoder.empty_past()
            while done < len(ids):
                end = chunk_end(done, len(ids), n)
                logits, presents = decoder(*chunk_inputs(ids, done, end), past)
                past, done = [np.ascontiguousarray(p[:, :, :end]) for p in presents], end
            worst = max(worst, float(np.abs(logits[0, -1] - whole[0, -1]).max()))
            flips += int(np.argmax(logits[0, -1]) != np.argmax(whole[0, -1]))
        out[str(n)] = {"max_abs_logit_diff": worst, "first_token_flips": flips}
        log.info(f"  chunks of {n}: max abs logit diff {worst:.3g}, first tokens differ {flips}")
    return out


def _engine(model_dir: Path) -> Any:
    """The served engine in-process, started, without queue refusals (the forecast is not
    measured here: under a busy machine the warm-up's own flood would be refused)."""
    from tritonforge.generate_engine import GenerateEngine
    from tritonforge.modelconfig import ModelConfig

    engine = GenerateEngine(
        ModelConfig.from_pbtxt((model_dir / "config.pbtxt").read_text()), model_dir / "1"
    )
    engine.scheduler.queue_timeout_s = None
    engine.warmup("Hello")
    engine.start()
    return engine


def main(argv: Sequence[str] | None = None) -> int:
    from tritonforge.loadtest.bench.generate import PROMPTS, engine_stream, run_cell

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    p.add_argument("--model", default="generate")
    p.add_argument("--chunks", type=int, nargs="+", default=[0, 16, 32, 64])
    p.add_argument("--concurrency", type=int, nargs="+", default=[8, 16])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--stall-row-tokens",
        type=int,
        default=0,
        help="prefill_stall_row_tokens for every setting (default 0: fixed chunks)",
    )
    p.add_argument("--out", type=Path, default=Path("build/chunked_prefill.json"))
    args = p.parse_args(argv)

    engine = _engine(args.model_repository / args.model)
    lengths = [len(engine.prompt_ids(t, True)) for t in PROMPTS]
    log.info(f"prompt tokens {lengths}")
    report: dict[str, Any] = {"prompt_tokens": lengths, "logits": {}, "cells": [], "same": {}}
    report["logits"] = logits_check(engine, PROMPTS, args.chunks)

    def count(text: str) -> int:
        return len(engine.tokenizer.encode(text, add_special_tokens=False).ids)

    stream, texts = engine_stream(engine), dict[int, dict[str, str]]()
    for rnd in range(args.rounds):
        for c in args.concurrency:
            for n in args.chunks:
                engine.scheduler.chunk_tokens = check_chunk_tokens(n)
                engine.scheduler.stall_row_tokens = check_stall_row_tokens(args.stall_row_tokens)
                collect = texts.setdefault(n, {}) if rnd == 0 else None
                cell = run_cell(f"chunk {n}", stream, count, c, 1, args.max_tokens, collect)
                cell.round = rnd
                load = os.getloadavg()[0]
                report["cells"].append({**asdict(cell), "chunk_tokens": n, "load": load})
                log.info(
                    f"round {rnd} x{c} chunk {n}: {cell.tokens_per_s:.1f} tok/s, TTFT p50 "
                    f"{cell.ttft_p50_ms:.0f} ms, ITL p99 {cell.itl_p99_ms:.0f} ms (gap "
                    f"{cell.chunk_gap_p99_ms:.0f}), load {load:.1f}"
                )
    base = texts.get(args.chunks[0], {})
    report["same"] = {str(n): t == base for n, t in texts.items()}
    log.info(f"greedy texts identical to chunk {args.chunks[0]}'s: {report['same']}")
    engine.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
