"""Verification of an exported decoder against PyTorch (Hugging Face transformers).

* :func:`check_grid`: logits on a (batch, past, new) grid including past 0, prefill followed by
  a cached step, and mixed-length batches padded as the graph's cache layout wants (left or
  right, :mod:`tritonforge.kv_batch`) decoded for a few greedy steps;
* :func:`fidelity`: greedy tokens through the serving scheduler vs ``model.generate``, with the
  logit margin at any divergence, and batching invariance (alone vs inside a batch);
* :func:`perplexity`: held-out perplexity of a step function (the int8 gate).

Every function returns ``(summary, failures)``: failures are one line each, collected by the
caller into one :class:`export.errors.VerificationError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tritonforge.kv_batch import LEFT, RIGHT, RightKVBatch
from tritonforge.sampling import SamplingParams
from tritonforge.scheduler import Generation, Scheduler, StepFn
from tritonforge.tasks.generation.export.spec import DecoderSpec
from tritonforge.text_stream import TextStream

Past = list[np.ndarray]


@dataclass
class Compare:
    label: str
    max_abs: float
    ratio: float  # worst |a - b| / (atol + rtol |b|); > 1 fails


def compare(label: str, got: np.ndarray, want: np.ndarray, spec: DecoderSpec) -> Compare:
    diff = np.abs(got.astype(np.float64) - want)
    bound = spec.logits_atol + spec.logits_rtol * np.abs(want)
    return Compare(label, float(diff.max(initial=0.0)), float((diff / bound).max(initial=0.0)))


def hf_logits(model: Any, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """PyTorch logits for full sequences (left padding: positions count valid tokens only)."""
    ids_t, mask_t = torch.from_numpy(ids), torch.from_numpy(mask)
    positions = (mask_t.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = model(input_ids=ids_t, attention_mask=mask_t, position_ids=positions)
    return np.asarray(out.logits.float().numpy())


def check_grid(
    spec: DecoderSpec, step: StepFn, empty_past: Any, model: Any, vocab: int, layout: str = LEFT
) -> tuple[dict[str, Any], list[str]]:
    rng = np.random.default_rng(11)
    results: list[Compare] = []
    for b, p, s in spec.grid:
        ids = rng.integers(3, vocab, size=(b, p + s), dtype=np.int64)
        want = hf_logits(model, ids, np.ones_like(ids))
        past = empty_past(b)
        if p:
            logits, past = step(ids[:, :p], np.ones((b, p), np.int64), _arange(b, 0, p), past)
            results.append(compare(f"b{b} prefill {p}", logits, want[:, :p], spec))
        label = f"b{b} past {p} new {s}"
        if layout == RIGHT and p and s > 1 and b > 1:
            # GroupQueryAttention takes several new tokens after a past at batch 1 only (the
            # scheduler never asks: prefills have no past, decode steps one token)
            rows = [
                step(ids[i : i + 1, p:], np.ones((1, p + s), np.int64), _arange(1, p, p + s), r)[0]
                for i, r in enumerate(_rows(past))
            ]
            logits, label = np.concatenate(rows), f"{label} (row by row)"
        else:
            logits, _ = step(ids[:, p:], np.ones((b, p + s), np.int64), _arange(b, p, p + s), past)
        results.append(compare(label, logits, want[:, p:], spec))
    padded = _padded if layout == LEFT else _right_padded
    for lengths in spec.padded_batches:
        results += padded(spec, step, empty_past, model, vocab, lengths, rng)
    failures = [
        f"logits {r.label}: max abs {r.max_abs:.3g} exceeds atol {spec.logits_atol} + rtol "
        f"{spec.logits_rtol} (ratio {r.ratio:.2f})"
        for r in results
        if r.ratio > 1.0
    ]
    worst = max(results, key=lambda r: r.ratio)
    summary = {
        "cases": len(results),
        "max_abs": max(r.max_abs for r in results),
        "worst": {"label": worst.label, "max_abs": worst.max_abs, "ratio": worst.ratio},
        "atol": spec.logits_atol,
        "rtol": spec.logits_rtol,
    }
    return summary, failures


def _rows(past: Past) -> list[Past]:
    """Each batch row's caches (batch 1)."""
    return [[p[i : i + 1] for p in past] for i in range(past[0].shape[0])]


def _arange(b: int, start: int, stop: int) -> np.ndarray:
    return np.tile(np.arange(start, stop, dtype=np.int64), (b, 1))


def _padded(
    spec: DecoderSpec,
    step: StepFn,
    empty_past: Any,
    model: Any,
    vocab: int,
    lengths: Sequence[int],
    rng: np.random.Generator,
) -> list[Compare]:
    """Left-padded rows prefilled together, then ``decode_steps`` greedy cached steps."""
    b, width = len(lengths), max(lengths)
    ids = np.zeros((b, width), np.int64)
    mask = np.zeros((b, width), np.int64)
    for i, n in enumerate(lengths):
        ids[i, width - n :] = rng.integers(3, vocab, size=n)
        mask[i, width - n :] = 1
    positions = (np.cumsum(mask, -1) - 1).clip(0)
    label = "padded " + "/".join(map(str, lengths))
    out: list[Compare] = []
    logits, past = step(ids, mask, positions, empty_past(b))
    want = hf_logits(model, ids, mask)
    valid = mask.astype(bool)
    out.append(compare(f"{label} prefill", logits[valid], want[valid], spec))
    for k in range(spec.decode_steps):
        token = logits[:, -1].argmax(-1)[:, None]
        ids, mask = np.concatenate([ids, token], 1), np.concatenate([mask, np.ones((b, 1))], 1)
        mask = mask.astype(np.int64)
        logits, past = step(token, mask, positions[:, -1:] + 1, past)
        positions = np.concatenate([positions, positions[:, -1:] + 1], 1)
        want = hf_logits(model, ids, mask)
        out.append(compare(f"{label} decode {k + 1}", logits[:, -1], want[:, -1], spec))
    return out


def _right_padded(
    spec: DecoderSpec,
    step: StepFn,
    empty_past: Any,
    model: Any,
    vocab: int,
    lengths: Sequence[int],
    rng: np.random.Generator,
) -> list[Compare]:
    """Right-padded rows (each from column 0) prefilled together, then ``decode_steps`` greedy
    cached steps with the served running batch's masks (:class:`RightKVBatch`); each row is
    compared with PyTorch on its own tokens."""
    b, width = len(lengths), max(lengths)
    rows = [rng.integers(3, vocab, size=n).tolist() for n in lengths]
    ids = np.zeros((b, width), np.int64)
    mask = np.zeros((b, width), np.int64)
    for i, (r, n) in enumerate(zip(rows, lengths, strict=True)):
        ids[i, :n], mask[i, :n] = r, 1
    label = "right-padded " + "/".join(map(str, lengths))
    logits, past = step(ids, mask, _arange(b, 0, width), empty_past(b))
    got = [logits[i, :n] for i, n in enumerate(lengths)]
    want = [hf_logits(model, np.asarray([r]), np.ones((1, len(r)), np.int64))[0] for r in rows]
    out = [compare(f"{label} prefill", np.concatenate(got), np.concatenate(want), spec)]
    batch = RightKVBatch(past=[np.ascontiguousarray(p[:, :, :width]) for p in past])
    batch.positions = np.asarray(lengths, np.int64)
    for k in range(spec.decode_steps):
        token = np.asarray([g[-1].argmax() for g in got], np.int64)
        for r, t in zip(rows, token, strict=True):
            r.append(int(t))
        mask = batch.step_mask()
        logits, presents = step(token[:, None], mask, batch.positions[:, None], batch.past)
        batch.past, batch.positions = presents, batch.positions + 1
        got = [logits[i, -1:] for i in range(b)]
        want = [
            hf_logits(model, np.asarray([r]), np.ones((1, len(r)), np.int64))[0, -1:] for r in rows
        ]
        out.append(
            compare(f"{label} decode {k + 1}", np.concatenate(got), np.concatenate(want), spec)
        )
    return out


def _raise(_: Generation, error: Exception) -> None:
    raise error


def scheduler_tokens(
    step: StepFn,
    empty_past: Any,
    tokenizer: Any,
    prompts: Sequence[list[int]],
    new_tokens: int,
    eos_ids: Sequence[int],
    max_running: int,
    name: str,
    layout: str = LEFT,
    kv_headroom: int = 0,
) -> list[list[int]]:
    """Greedy tokens of ``prompts`` through the serving scheduler (``max_running`` at a time,
    the running batch in the step's cache ``layout``); ``name``: the model whose decoder it is
    (its messages name it)."""
    scheduler = Scheduler(
        step,
        empty_past,
        eos_ids,
        max_running,
        max_queue=len(prompts),
        name=name,
        layout=layout,
        kv_headroom=kv_headroom,
    )
    results: list[Generation] = []
    for ids in prompts:
        seq = Generation(
            ids,
            SamplingParams(max_new_tokens=new_tokens),
            TextStream(tokenizer),
            on_output=lambda *_: None,
            on_error=_raise,
        )
        scheduler.submit(seq)
        results.append(seq)
    scheduler.run_until_idle()
    return [s.tokens for s in results]


def reference_generate(
    model: Any, prompts: Sequence[list[int]], new_tokens: int
) -> list[tuple[list[int], list[np.ndarray]]]:
    """PyTorch ``generate`` (greedy, batch 1): tokens (without eos) and each step's logits."""
    out = []
    for ids in prompts:
        with torch.no_grad():
            gen = model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=new_tokens,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
                pad_token_id=model.config.eos_token_id,
            )
        tokens = gen.sequences[0, len(ids) :].tolist()
        eos = model.config.eos_token_id
        eos_set = set(eos if isinstance(eos, list) else [eos])
        cut = next((i for i, t in enumerate(tokens) if t in eos_set), len(tokens))
        out.append((tokens[:cut], [lg[0].float().numpy() for lg in gen.logits]))
    return out


def margin(logits: np.ndarray) -> float:
    top = np.sort(logits)[-2:]
    return float(top[1] - top[0])


def fidelity(
    reference: Sequence[tuple[list[int], list[np.ndarray]]],
    alone: Sequence[list[int]],
    batched: Sequence[list[int]],
    tie_margin: float,
) -> tuple[dict[str, Any], list[str]]:
    """Greedy tokens vs PyTorch (``alone``) and alone vs in-batch. A divergence fails unless
    PyTorch's own top-2 margin at that step is below ``tie_margin`` (a numerical tie)."""
    failures: list[str] = []
    divergences = []
    for i, ((want, logits), got) in enumerate(zip(reference, alone, strict=True)):
        at = _first_difference(want, got)
        if at is None:
            continue
        m = margin(logits[at]) if at < len(logits) else float("nan")
        divergences.append({"prompt": i, "token": at, "reference_margin": m})
        if not m < tie_margin:
            failures.append(
                f"fidelity: prompt {i} diverges from PyTorch generate at token {at} "
                f"(PyTorch top-2 logit margin {m:.4f} >= {tie_margin})"
            )
    batch_diff = [
        {"prompt": i, "token": at}
        for i, (a, b) in enumerate(zip(alone, batched, strict=True))
        if (at := _first_difference(a, b)) is not None
    ]
    failures += [
        f"batching invariance: prompt {d['prompt']} differs inside a batch at token {d['token']}"
        for d in batch_diff
    ]
    summary = {
        "prompts": len(reference),
        "identical": len(reference) - len(divergences),
        "divergences": divergences,
        "batching_invariance_differences": batch_diff,
        "tokens": sum(len(t) for t in alone),
    }
    return summary, failures


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def agreement(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> float:
    """Fraction of ``a``'s tokens matched by ``b`` up to each sequence's first divergence."""
    total = sum(len(x) for x in a)
    same = sum(
        len(x) if (d := _first_difference(x, y)) is None else d for x, y in zip(a, b, strict=True)
    )
    return same / max(total, 1)


def teacher_forced_agreement(
    step: StepFn, empty_past: Any, prompts: Sequence[list[int]], tokens: Sequence[list[int]]
) -> float:
    """Fraction of positions where ``step``'s argmax equals ``tokens`` (a reference's greedy
    continuation of each prompt) given the reference prefix: one forward per prompt. Unlike
    free-running agreement, one early near-tie does not count every later token as wrong."""
    same = total = 0
    for ids, want in zip(prompts, tokens, strict=True):
        if not want:
            continue
        x = np.asarray([ids + want[:-1]], np.int64)
        logits, _ = step(x, np.ones_like(x), _arange(1, 0, x.shape[1]), empty_past(1))
        got = logits[0, len(ids) - 1 :].argmax(-1)
        same += int((got == np.asarray(want)).sum())
        total += len(want)
    return same / max(total, 1)


def perplexity(step: StepFn, empty_past: Any, rows: Sequence[list[int]]) -> float:
    """exp(mean next-token negative log-likelihood) over ``rows`` (each scored alone)."""
    nll, count = 0.0, 0
    for ids in rows:
        x = np.asarray([ids], np.int64)
        logits, _ = step(x, np.ones_like(x), _arange(1, 0, len(ids)), empty_past(1))
        lg = logits[0, :-1].astype(np.float64)
        lse = np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1)) + lg.max(-1)
        nll += float((lse - lg[np.arange(len(ids) - 1), ids[1:]]).sum())
        count += len(ids) - 1
    return float(np.exp(nll / count))
