"""Fused (GroupQueryAttention) decoder graphs vs the torch.onnx export, in-process (issue 20).

One decode step at batch 1, 8, 16 with :data:`PAST` cached columns, interleaved rounds (every
round measures every graph once, so a load swing on the shared machine hits all alike), plus
the semantics of a right-padded batch on the GQA graphs: a row decoded alone vs inside a batch of
rows of other lengths, a right-padded batched prefill vs alone (max abs logit difference, 0.0 =
bit-identical).

``python -m tritonforge.loadtest.bench.gqa_experiments --graph NAME=PATH ...`` prints JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tritonforge.decoder import OrtDecoder

PAST = 72
BATCHES = (1, 8, 16)
STEPS = 8


def step_ms(dec: OrtDecoder, batch: int, past: int = PAST, steps: int = STEPS) -> float:
    """Median ms of one decode step; the cache grows by one column per step as served."""
    rng = np.random.default_rng(0)
    ids = np.full((batch, 1), 5, np.int64)
    pos = np.full((batch, 1), past, np.int64)
    cache = [
        rng.standard_normal((batch, dec.kv_heads, past, dec.head_dim)).astype(np.float32)
        for _ in dec.past
    ]
    times = []
    for k in range(steps):
        m = np.ones((batch, past + k + 1), np.int64)
        t = time.perf_counter()
        _, cache = dec(ids, m, pos + k, cache)
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1000)


def shared_buffer_step_ms(
    dec: OrtDecoder, batch: int, past: int = PAST, steps: int = STEPS
) -> tuple[float, float]:
    """GenAI's ``past_present_share_buffer``: each past and its present are ONE preallocated
    buffer (``past + steps`` columns) bound with IO binding, so a step writes only its new
    column; returns (median ms per step, max abs logit difference vs the copying path)."""
    import onnxruntime as ort

    from tritonforge.decoder import present_names

    rng = np.random.default_rng(0)
    start = [
        rng.standard_normal((batch, dec.kv_heads, past, dec.head_dim)).astype(np.float32)
        for _ in dec.past
    ]
    cap = past + steps
    bufs = [np.zeros((batch, dec.kv_heads, cap, dec.head_dim), np.float32) for _ in dec.past]
    for b, s0 in zip(bufs, start, strict=True):
        b[:, :, :past] = s0
    values = [ort.OrtValue.ortvalue_from_numpy(b) for b in bufs]
    io = dec.session.io_binding()
    for name, v in zip(dec.past, values, strict=True):
        io.bind_ortvalue_input(name, v)
    for name, v in zip(present_names(dec.layers), values, strict=True):
        io.bind_ortvalue_output(name, v)
    ids = np.full((batch, 1), 5, np.int64)
    times, cache = [], start
    worst = 0.0
    for k in range(steps):
        mask = np.ones((batch, past + k + 1), np.int64)
        io.bind_cpu_input("input_ids", ids)
        io.bind_cpu_input("attention_mask", mask)
        io.bind_output("logits")
        t = time.perf_counter()
        dec.session.run_with_iobinding(io)
        times.append(time.perf_counter() - t)
        got = next(o for o in io.copy_outputs_to_cpu() if o.ndim == 3)  # logits
        want, cache = dec(ids, mask, np.full((batch, 1), past + k, np.int64), cache)
        worst = max(worst, float(np.abs(got - want).max()))
    return float(np.median(times) * 1000), worst


def prefill_ms(dec: OrtDecoder, batch: int, length: int = 40, repeats: int = 2) -> float:
    """Median ms of one right-padded prefill of ``batch`` prompts of ``length`` tokens."""
    ids = np.full((batch, length), 7, np.int64)
    mask = np.ones_like(ids)
    pos = np.tile(np.arange(length), (batch, 1))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        dec(ids, mask, pos, dec.empty_past(batch))
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1000)


def right_padded_checks(dec: OrtDecoder, lengths: Sequence[int], decode: int = 4) -> dict[str, Any]:
    """Max abs logit difference between each row alone and inside a right-padded batch: the
    batched prefill, then ``decode`` greedy steps."""
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, dec.vocab_size, size=n) for n in lengths]
    b, width = len(lengths), max(lengths)
    ids = np.zeros((b, width), np.int64)
    mask = np.zeros((b, width), np.int64)
    for i, (p, n) in enumerate(zip(prompts, lengths, strict=True)):
        ids[i, :n], mask[i, :n] = p, 1
    pos = np.tile(np.arange(width), (b, 1))
    logits, past = dec(ids, mask, pos, dec.empty_past(b))
    alone = []
    prefill_diff = 0.0
    for i, (p, n) in enumerate(zip(prompts, lengths, strict=True)):
        la, pa = dec(p[None], np.ones((1, n), np.int64), np.arange(n)[None], dec.empty_past(1))
        prefill_diff = max(prefill_diff, float(np.abs(la[0] - logits[i, :n]).max()))
        alone.append((la[0, -1], pa))
    lens = np.array(lengths)
    last = np.array([logits[i, n - 1].argmax() for i, n in enumerate(lengths)])
    decode_diff = []
    for _ in range(decode):
        w = past[0].shape[2]
        m = (np.arange(w + 1)[None] < (lens + 1)[:, None]).astype(np.int64)
        logits, past = dec(last[:, None], m, lens[:, None], past)
        worst = 0.0
        for i, n in enumerate(lens):
            tok = last[i : i + 1, None]
            la, pa = dec(tok, np.ones((1, n + 1), np.int64), np.array([[n]]), alone[i][1])
            worst = max(worst, float(np.abs(la[0, -1] - logits[i, -1]).max()))
            alone[i] = (la[0, -1], pa)
        decode_diff.append(worst)
        last = logits[:, -1].argmax(-1)
        lens = lens + 1
    return {"lengths": list(lengths), "prefill": prefill_diff, "decode": decode_diff}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--graph", nargs="+", required=True, help="NAME=PATH")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    ap.add_argument("--prefill", type=int, nargs="*", default=[], help="prefill batch sizes")
    ap.add_argument("--shared", nargs="*", default=[], help="names to time with a shared buffer")
    ap.add_argument("--checks", nargs="*", default=[], help="names to run the padding checks on")
    ap.add_argument(
        "--pairs", nargs="*", default=[], help="BASE:NEW pairs whose per-round ratio to report"
    )
    args = ap.parse_args(argv)
    decs = {
        n: OrtDecoder(Path(p), intra_op_threads=2) for n, p in (g.split("=") for g in args.graph)
    }
    out: dict[str, Any] = {"load": Path("/proc/loadavg").read_text().split()[:3]}
    for name in args.checks:
        out[f"checks {name}"] = [
            right_padded_checks(decs[name], ls) for ls in ((5, 13, 29), (40, 7), (16, 16, 3, 31))
        ]
        print(json.dumps(out[f"checks {name}"]), flush=True)
    for dec in decs.values():  # the first runs pay for allocations
        step_ms(dec, 1, steps=2)
    times: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for b in args.batches:
            for name, dec in decs.items():
                times.setdefault(f"{name} b{b}", []).append(step_ms(dec, b))
            for name in args.shared:
                ms, diff = shared_buffer_step_ms(decs[name], b)
                times.setdefault(f"{name}+shared b{b}", []).append(ms)
                out.setdefault("shared_max_abs_diff", {})[f"{name} b{b}"] = diff
        for b in args.prefill:
            for name, dec in decs.items():
                times.setdefault(f"{name} prefill b{b}", []).append(prefill_ms(dec, b))
        print(json.dumps({k: round(float(np.median(v)), 2) for k, v in times.items()}), flush=True)
    out["step_ms"] = {k: float(np.median(v)) for k, v in times.items()}
    out["step_ms_min"] = {k: float(np.min(v)) for k, v in times.items()}
    # BASE time / NEW time per round (one round measures both within seconds), median of rounds
    out["speedup"] = {
        f"{new} vs {base} {k}": float(
            np.median(np.asarray(times[f"{base} {k}"]) / np.asarray(times[f"{new} {k}"]))
        )
        for base, new in (pair.split(":") for pair in args.pairs)
        for k in [*(f"b{b}" for b in args.batches), *(f"prefill b{b}" for b in args.prefill)]
    }
    out["load_after"] = Path("/proc/loadavg").read_text().split()[:3]
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
