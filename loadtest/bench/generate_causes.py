"""Each generation goal's measured cause (issue #35: the bench prints every target as met or
missed *with its measured cause*): our decoder's step timed alone in the bench's process (the
served model's config and session options, no server) at the rows each goal runs, and a
batch-1 call of a prompt's tail after a past; :func:`cause` says what the served figure is
against them. Timed before the servers start, so nothing else runs beside it."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tritonforge.modelconfig import ModelConfig


@dataclass(frozen=True)
class StepTimes:
    """Median ms of our decoder alone: ``decode_ms[rows]`` one decode step of ``rows`` rows
    after ``past`` columns each (in place, as served), ``tail_ms`` one batch-1 call of
    ``tail_tokens`` new tokens after ``past`` columns (a cached prompt's rest)."""

    decode_ms: dict[int, float]
    tail_ms: float
    past: int
    tail_tokens: int


def _median_ms(call: Callable[[], object], repeats: int) -> float:
    call()  # the first call of a shape pays ONNX Runtime's allocations
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def measure(
    model_dir: Path, rows: Sequence[int], past: int, tail_tokens: int, repeats: int = 8
) -> StepTimes:
    """Time ``model_dir``'s decoder (a ``generate`` model directory) alone, as it serves."""
    from tritonforge.generate_engine import GenerateEngine

    config = ModelConfig.from_pbtxt((model_dir / "config.pbtxt").read_text())
    engine = GenerateEngine(config, model_dir / "1")  # not started: no scheduler thread
    decoder = engine.decoder
    try:

        def step(b: int, new: int) -> Callable[[], object]:
            cache = [
                np.zeros((b, decoder.kv_heads, past + new + 64, decoder.head_dim), np.float32)
                for _ in decoder.past
            ]
            ids = np.full((b, new), 100, np.int64)
            mask = np.ones((b, past + new), np.int64)
            positions = np.repeat(np.arange(past, past + new, dtype=np.int64)[None], b, 0)
            return lambda: decoder(ids, mask, positions, cache)

        decode = {b: _median_ms(step(b, 1), repeats) for b in sorted(set(rows))}
        tail = _median_ms(step(1, tail_tokens), repeats)
    finally:
        engine.close()
    return StepTimes(decode, tail, past, tail_tokens)


def cause(
    field: str,
    rows: int,
    goal: float,
    ours: float,
    anchor: float,
    steps: StepTimes,
    fresh_prompts: bool,
) -> str:
    """What the goal's served figure ``ours`` (against the anchor's ``anchor``) is made of, in
    this run's step times. ``field``: the goal's cell field (``decode_tok_s``,
    ``tokens_per_s``, ``ttft_p50_ms``, ``itl_p99_ms``) at ``rows`` streams."""
    step_ms = steps.decode_ms.get(rows, float("nan"))
    if field in ("decode_tok_s", "tokens_per_s"):
        ceiling = rows * 1000.0 / step_ms
        where = (
            f"our {rows}-row step alone takes {step_ms:.1f} ms: at most {ceiling:.0f} tok/s"
            f" (served {ours:.0f}, {ours / ceiling:.0%} of it)"
        )
        if ceiling < goal * anchor:
            return f"the step itself: {where}, under the goal ({goal:g}x {anchor:.0f})"
        return f"the serving path: {where}; prefills between steps and responses take the rest"
    if field == "ttft_p50_ms":
        serial = rows * steps.tail_ms
        if not fresh_prompts:
            return (
                f"every prompt was sent in an earlier round: its first token comes from the "
                f"prefix cache's logits with no decoder call; the {rows}-row step alone takes "
                f"{step_ms:.1f} ms (with --fresh-prompts each prompt's tail is a batch-1 call "
                f"of ~{steps.tail_ms:.0f} ms)"
            )
        return (
            f"each prompt's tail after the shared start is a batch-1 call (ONNX Runtime's "
            f"GroupQueryAttention takes several new tokens after a past only at batch 1): "
            f"{steps.tail_tokens} tokens take {steps.tail_ms:.1f} ms alone, {rows} one after "
            f"another {serial:.0f} ms (served p50 {ours:.0f} ms)"
        )
    # itl_p99_ms: a token's worst wait against one step of the running rows
    return (
        f"the {rows}-row step alone takes {step_ms:.1f} ms; the rest of the p99 "
        f"({ours - step_ms:.0f} ms) is the scheduler's other work between steps (prompts "
        "prefilled, responses) and the serving path"
    )
