"""What the in-flight scheduler prefills in one iteration (issue #35: a new prompt never stalls
the running rows for a whole prefill).

Without chunking (``chunk_tokens`` None) an iteration prefills, in one call, every queued prompt
that fits the free slots and ``max_prefill_tokens`` padded tokens (a longer first prompt alone,
whole), and the running rows wait for all of it. With chunked prefill (vLLM's
``max_num_batched_tokens`` for the prompt side) an iteration prefills at most ``chunk_tokens``
prompt tokens between two decode steps: whole prompts batched together while rows x longest
fits, or ONE prompt longer than that in chunks of ``chunk_tokens`` (batch 1: ONNX Runtime's
GroupQueryAttention takes several new tokens after a past only at batch 1), the chunk's keys
and values appended to its own cache; its last chunk gives its first token. Right-padded,
each row from column 0, so a chunked row's cache is laid out as its whole prefill's.

The chunk protects the running rows' inter-token latency, so it depends on what runs
(:func:`iteration_chunk`): with ``stall_row_tokens`` set, an iteration with no row decoding
prefills whole prompts (the whole wave batched, nothing to protect), and with ``running`` rows
decoding it may stall them for ``stall_row_tokens // running`` prompt tokens, never fewer than
``chunk_tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tritonforge.scheduler import Generation


@dataclass(eq=False)
class Partial:
    """A prompt prefilled in part: its first ``done`` tokens' keys/values in ``past`` (batch 1,
    ``done`` columns)."""

    seq: Generation
    past: list[np.ndarray]
    done: int = 0

    @property
    def left(self) -> int:
        """Prompt tokens still to prefill."""
        return len(self.seq.prompt_ids) - self.done


def check_chunk_tokens(chunk_tokens: int | None) -> int | None:
    """``chunk_tokens`` itself (None or 0: no chunking, returned as None); ValueError naming the
    config parameter when it is negative."""
    if chunk_tokens is not None and chunk_tokens < 0:
        raise ValueError(f"prefill_chunk_tokens must be >= 0 (0: off), got {chunk_tokens}")
    return chunk_tokens or None


def check_stall_row_tokens(stall_row_tokens: int) -> int:
    """``stall_row_tokens`` itself; ValueError naming the config parameter when negative."""
    if stall_row_tokens < 0:
        raise ValueError(
            f"prefill_stall_row_tokens must be >= 0 (0: a fixed chunk), got {stall_row_tokens}"
        )
    return stall_row_tokens


def iteration_chunk(running: int, chunk_tokens: int | None, stall_row_tokens: int) -> int | None:
    """The chunk of this iteration with ``running`` rows decoding: ``chunk_tokens`` when it is
    None (no chunking) or ``stall_row_tokens`` is 0 (a fixed chunk); else None (whole prompts)
    when no row runs, and ``max(chunk_tokens, stall_row_tokens // running)`` when some do."""
    if chunk_tokens is None or not stall_row_tokens:
        return chunk_tokens
    if running <= 0:
        return None
    return max(chunk_tokens, stall_row_tokens // running)


def call_budget(max_prefill_tokens: int, chunk_tokens: int | None) -> int:
    """The padded tokens (rows x longest) one prefill call of whole prompts may take."""
    return max_prefill_tokens if chunk_tokens is None else min(max_prefill_tokens, chunk_tokens)


def group_size(lengths: Sequence[int], free_slots: int, max_tokens: int) -> int:
    """How many prompts from the queue's head (``lengths``, in queue order) one prefill call
    takes: while a slot is free and rows x longest stays within ``max_tokens``; the first one
    always (a longer one goes alone: whole, or chunked when :func:`chunked`)."""
    count, width = 0, 0
    for n in lengths[: max(0, free_slots)]:
        width = max(width, n)
        if count and width * (count + 1) > max_tokens:
            break
        count += 1
    return count


def chunked(length: int, chunk_tokens: int | None) -> bool:
    """Whether a prompt of ``length`` tokens is prefilled in chunks."""
    return chunk_tokens is not None and length > chunk_tokens


def chunk_end(done: int, length: int, chunk_tokens: int | None) -> int:
    """Where the next prefill call of a prompt of ``length`` tokens ends, ``done`` cached. Never
    one token left for a last call when the chunk can take one fewer: a one-token call takes
    ONNX Runtime's one-row matmul path, whose last bits differ from a wider call's (measured:
    docs/performance.md, "Prefix cache"), so a 33-token prompt in chunks of 32 goes 31 + 2."""
    if chunk_tokens is None:
        return length
    end = min(length, done + chunk_tokens)
    return end - 1 if length - end == 1 and end - done > 1 else end


def group_inputs(prompts: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ids, mask, positions)`` of whole prompts prefilled together without a past:
    right-padded (each row's tokens first, from column 0: a row then computes exactly what it
    computes alone; left padding changes its bits, measured)."""
    width = max(len(p) for p in prompts)
    ids = np.zeros((len(prompts), width), np.int64)
    mask = np.zeros_like(ids)
    for i, prompt in enumerate(prompts):
        ids[i, : len(prompt)] = prompt
        mask[i, : len(prompt)] = 1
    positions = np.tile(np.arange(width, dtype=np.int64), (len(prompts), 1))
    return ids, mask, positions


def chunk_inputs(
    prompt: Sequence[int], done: int, end: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ids, mask, positions)`` of tokens ``[done, end)`` of one prompt after its first
    ``done`` tokens' cache (batch 1; the mask covers the past and the chunk)."""
    ids = np.asarray([prompt[done:end]], np.int64)
    mask = np.ones((1, end), np.int64)
    positions = np.arange(done, end, dtype=np.int64)[None]
    return ids, mask, positions
