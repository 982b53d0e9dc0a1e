"""Per-token cost of each structured-generation processor (docs/structured.md), in-process on a
49,152-wide logits row: greedy choice alone (today's path), then with logit_bias, penalties,
the grammar mask, logprobs (top 0 and 20), all together; rounds interleaved, next to one int8
decode step of the served model for scale.

``python -m tritonforge.tasks.generation.loadtest.structured_cost [--model-dir model_repository/generate]``"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tritonforge.sampling import SamplingParams, sample_next
from tritonforge.tasks.generation.structured import (
    GrammarTokenizer,
    LogitBias,
    LogprobRecorder,
    Penalties,
    RowChain,
)

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 32},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city", "zip"],
        },
    },
    "required": ["name", "age", "tags", "address"],
}
INSTANCE = {
    "name": "Ada Lovelace",
    "age": 36,
    "tags": ["math", "engines", "poetry"],
    "address": {"city": "London", "zip": "W1"},
}


def _time_chain(
    make: Callable[[], RowChain | None], tokens: list[int], rows: np.ndarray
) -> list[float]:
    """Microseconds per token: process, greedy choice (forced to the instance's token so the
    grammar stays on its path), accept."""
    chain, params, rng = make(), SamplingParams(max_new_tokens=1), np.random.default_rng(0)
    out = []
    for token, row in zip(tokens, rows, strict=True):
        t0 = time.perf_counter()
        logits = row if chain is None else chain.process(row)
        sample_next(logits, params, rng)
        if chain is not None:
            chain.accept(token, row)
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def _decode_step_ms(model_dir: Path, steps: int) -> list[float]:
    from tritonforge.generate_engine import GenerateEngine
    from tritonforge.modelconfig import ModelConfig

    config = ModelConfig.from_pbtxt((model_dir / "config.pbtxt").read_text())
    engine = GenerateEngine(config, model_dir / "1")
    times: list[float] = []
    t_last = [0.0]

    def on_step(running: int, waiting: int) -> None:
        now = time.perf_counter()
        if t_last[0]:
            times.append((now - t_last[0]) * 1e3)
        t_last[0] = now

    engine.scheduler.on_step = on_step
    seq = engine.build("Tell me a story.", {"max_tokens": steps}, lambda *_: None, lambda *_: None)
    engine.scheduler.submit(seq)
    engine.scheduler.run_until_idle()
    return times[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-dir", type=Path, default=Path("model_repository/generate"))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(args.model_dir / "1" / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    meta = json.loads((args.model_dir / "1" / "generation.json").read_text())
    eos = int(meta["eos_token_ids"][0])
    gt = GrammarTokenizer(tok, eos, vocab)
    tokens = [*tok.encode(json.dumps(INSTANCE, separators=(",", ":"))).ids, eos]
    rows = np.random.default_rng(1).standard_normal((len(tokens), vocab)).astype(np.float32)
    bias = {int(i): 5.0 for i in np.random.default_rng(2).integers(0, vocab, 10)}
    cases: dict[str, Callable[[], RowChain | None]] = {
        "none (today's path)": lambda: None,
        "logit_bias (10 tokens)": lambda: RowChain([LogitBias(bias)]),
        "presence+frequency penalties": lambda: RowChain([Penalties(0.5, 0.5)]),
        "grammar (JSON schema)": lambda: RowChain([gt.matcher(SCHEMA)]),
        "logprobs (top 0)": lambda: RowChain([], LogprobRecorder(0)),
        "logprobs (top 20)": lambda: RowChain([], LogprobRecorder(20)),
        "all of them": lambda: RowChain(
            [LogitBias(bias), Penalties(0.5, 0.5), gt.matcher(SCHEMA)], LogprobRecorder(20)
        ),
    }
    results: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, make in cases.items():
            results[name] += _time_chain(make, tokens, rows)
    step_ms = _decode_step_ms(args.model_dir, 24)
    print(f"load average {os.getloadavg()}; {len(tokens)} tokens x {args.rounds} rounds")
    base = statistics.median(results["none (today's path)"])
    for name, t in results.items():
        med = statistics.median(t)
        print(
            f"{name:30s} median {med:7.1f} us  p90 {np.percentile(t, 90):7.1f} us  "
            f"(+{med - base:6.1f} us over none)"
        )
    print(f"int8 decode step, batch 1: median {statistics.median(step_ms):.1f} ms")


if __name__ == "__main__":
    main()
