"""The running batch of the in-flight scheduler: past keys/values left-padded to a common length
(:class:`KVBatch`), each row's padding kept a multiple of :data:`PAD_ALIGN` columns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tritonforge.scheduler import Generation

# Measured (docs/performance.md, "Batch invariance of the decoders"): a decode step gives a row
# exactly the bits it gets alone when its left padding is a multiple of 4 columns, whatever the
# batch (ONNX Runtime's Softmax and probs @ V MatMul over the cache columns); any other padding
# moved fp32 logits by ~2e-5 and int8's by ~0.5 (its activation quantization amplifies them),
# which flipped greedy tokens. Rows in one step never affect each other otherwise.
PAD_ALIGN = 4


@dataclass
class KVBatch:
    """The running batch: past keys/values left-padded to a common length, a mask over them,
    each row's next position and last token. Rows join (:meth:`add`) and leave (:meth:`remove`)
    between steps; columns masked in every row are trimmed. Every row's padding stays a
    multiple of ``align`` columns, so a row computes exactly what it computes alone: a row
    joins only when the width allows it (:meth:`can_add`)."""

    rows: list[Generation] = field(default_factory=list)
    past: list[np.ndarray] = field(default_factory=list)
    mask: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    positions: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    last: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    align: int = PAD_ALIGN

    def __len__(self) -> int:
        return len(self.rows)

    def can_add(self, length: int) -> bool:
        """Whether a row of ``length`` cached columns can join now with its padding (and the
        growth of the others' padding) a multiple of ``align``. The width grows by one column
        per decode step, so a waiting row can join within ``align - 1`` steps."""
        return not self.rows or (self.mask.shape[1] - length) % self.align == 0

    def add(self, seq: Generation, presents: list[np.ndarray], length: int, token: int) -> None:
        """Join a prefilled row (``presents``: batch 1, ``length`` columns, all valid)."""
        if not self.can_add(length):
            raise ValueError(
                f"a row of {length} columns cannot join a batch of width {self.mask.shape[1]} "
                f"(padding must be a multiple of {self.align})"
            )
        if not self.rows:
            self.rows, self.past = [seq], list(presents)
            self.mask = np.ones((1, length), np.int64)
            self.positions = np.array([length], np.int64)
            self.last = np.array([token], np.int64)
            return
        width = self.mask.shape[1]
        grow, pad = max(0, length - width), max(0, width - length)
        row_mask = np.concatenate([np.zeros((1, pad), np.int64), np.ones((1, length), np.int64)], 1)
        self.mask = np.concatenate([np.pad(self.mask, ((0, 0), (grow, 0))), row_mask], 0)
        spec = ((0, 0), (0, 0), (grow, 0), (0, 0))
        row_spec = ((0, 0), (0, 0), (pad, 0), (0, 0))
        self.past = [
            np.concatenate([np.pad(p, spec), np.pad(r, row_spec)], 0)
            for p, r in zip(self.past, presents, strict=True)
        ]
        self.rows.append(seq)
        self.positions = np.append(self.positions, length)
        self.last = np.append(self.last, token)

    def remove(self, leaving: Sequence[int]) -> None:
        if not leaving:
            return
        keep = [i for i in range(len(self.rows)) if i not in set(leaving)]
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.past, self.mask = [], np.zeros((0, 0), np.int64)
            self.positions = self.last = np.zeros(0, np.int64)
            return
        self.mask, self.positions, self.last = (
            self.mask[keep],
            self.positions[keep],
            self.last[keep],
        )
        # the first column some row still attends: a multiple of align, as every padding is
        start = int(np.argmax(self.mask.any(0)))
        self.mask = self.mask[:, start:]
        self.past = [np.ascontiguousarray(p[keep][:, :, start:]) for p in self.past]
