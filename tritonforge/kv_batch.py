"""The running batch of the in-flight scheduler, in the cache layout of the decoder graph:
:class:`KVBatch` keeps past keys/values LEFT-padded to a common length, each row's padding a
multiple of :data:`PAD_ALIGN` columns (the torch.onnx export, ``position_ids`` an input);
:class:`RightKVBatch` keeps every row from column 0, RIGHT-padded to the longest (graphs that
derive positions from the mask: ONNX Runtime's ``GroupQueryAttention``). :func:`new_batch`
picks one by layout. Both answer the same calls: :meth:`can_add`, :meth:`add`, :meth:`remove`,
:meth:`step_mask` and :meth:`advance`."""

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
# The cache layouts (``tritonforge.decoder.OrtDecoder.layout`` reads a graph's).
LEFT, RIGHT = "left", "right"


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

    def step_mask(self) -> np.ndarray:
        """The attention mask of the next decode step (the new token appended on the right)."""
        return np.concatenate([self.mask, np.ones((len(self.rows), 1), np.int64)], 1)

    def advance(self, presents: list[np.ndarray], mask: np.ndarray) -> None:
        """After a decode step fed ``mask`` (:meth:`step_mask`): its presents become the past."""
        self.past, self.mask = presents, mask
        self.positions = self.positions + 1

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


@dataclass
class RightKVBatch:
    """The running batch of a right-padded graph: every row's keys/values from column 0
    (``positions``: each row's length, its next position; the batch's :attr:`width` is the
    longest). A row joins at once (no alignment wait: a row's columns never move, measured
    bit-identical to the row alone, docs/performance.md).

    ``headroom`` 0: the cache is exactly :attr:`width` columns (trimmed when the longest row
    leaves), each step returns a new one a column wider. ``headroom`` > 0: the cache keeps room
    for the next column (grown by ``headroom`` columns when full), for a step that writes the
    new column into it in place (``OrtDecoder.in_place``); its rows then live in a pool of row
    slots (:attr:`past` is a view of the first ``len(rows)``), so a row joining copies only its
    own columns and a row leaving moves the last row into its slot, instead of copying the whole
    batch (at 16 rows the whole-batch copies took ~27% of the served scheduler's time, py-spy,
    docs/performance.md "The running batch's row slots")."""

    rows: list[Generation] = field(default_factory=list)
    past: list[np.ndarray] = field(default_factory=list)
    positions: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    last: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    headroom: int = 0
    # headroom > 0: [row slots, heads, columns, head_dim] per cache tensor; past views its rows
    _pool: list[np.ndarray] = field(default_factory=list, repr=False)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def width(self) -> int:
        return int(self.positions.max()) if self.positions.size else 0

    def can_add(self, length: int) -> bool:
        """Always: a row's columns start at 0 whatever the batch's width."""
        return True

    def add(self, seq: Generation, presents: list[np.ndarray], length: int, token: int) -> None:
        """Join a prefilled row (``presents``: batch 1, ``length`` columns, all valid)."""
        if self.headroom:
            self._slot_in(presents, length)
        elif self.rows:
            wide = max(self.past[0].shape[2], length)
            self.past = [
                np.concatenate([_right_pad(p, wide), _right_pad(r, wide)], 0)
                for p, r in zip(self.past, presents, strict=True)
            ]
        else:
            self.past = [np.ascontiguousarray(r) for r in presents]
        self.rows.append(seq)
        self.positions = np.append(self.positions, length).astype(np.int64)
        self.last = np.append(self.last, token).astype(np.int64)
        self._fit()

    def step_mask(self, tokens: int = 1) -> np.ndarray:
        """Each row's columns and its ``tokens`` new ones' (the graph places them at the row's
        length; several only at batch 1: ``tritonforge.speculation``)."""
        ends = self.positions + tokens
        return (np.arange(self.width + tokens)[None] < ends[:, None]).astype(np.int64)

    def advance(self, presents: list[np.ndarray], mask: np.ndarray, tokens: int = 1) -> None:
        """After a decode step: its presents (the same buffers when written in place, else
        wider) become the past, and each row keeps ``tokens`` new columns (fewer than the step
        fed: the others are dropped, a speculative step's rejected draft)."""
        if presents is not self.past:  # not written in place: a new cache
            self.past = presents
            if self.headroom:
                self._pool = [np.ascontiguousarray(p) for p in presents]
                self.past = list(self._pool)
        self.positions = self.positions + tokens
        self._fit()

    def reserve(self, tokens: int) -> None:
        """With ``headroom``: room for a step writing ``tokens`` new columns in place."""
        if self.headroom and self.rows and self.past[0].shape[2] < self.width + tokens:
            self._resize(self._pool[0].shape[0], self.width + tokens + self.headroom)

    def remove(self, leaving: Sequence[int]) -> None:
        if not leaving:
            return
        if self.headroom:
            self._slot_out(leaving)
            self._fit()
            return
        keep = [i for i in range(len(self.rows)) if i not in set(leaving)]
        self.rows = [self.rows[i] for i in keep]
        self.positions, self.last = self.positions[keep], self.last[keep]
        self.past = [np.ascontiguousarray(p[keep]) for p in self.past] if keep else []
        self._fit()

    def _fit(self) -> None:
        """Trim the cache to :attr:`width` (``headroom`` 0) or keep room for the next column."""
        if not self.rows:
            return
        have, width = self.past[0].shape[2], self.width
        if not self.headroom and have > width:
            self.past = [np.ascontiguousarray(p[:, :, :width]) for p in self.past]
        elif self.headroom and have <= width:
            self._resize(self._pool[0].shape[0], width + self.headroom)

    def _slot_in(self, presents: list[np.ndarray], length: int) -> None:
        """Copy a joining row into the next free slot (the pool grows, doubling its slots or to
        ``length`` + headroom columns, only when it must)."""
        n = len(self.rows)
        if not self._pool:
            self._pool = [
                np.zeros((1, r.shape[1], length + self.headroom, r.shape[3]), r.dtype)
                for r in presents
            ]
        slots, cols = self._pool[0].shape[0], self._pool[0].shape[2]
        if slots == n or cols < length:  # full (rows never outnumber slots), or too narrow
            self._resize(2 * slots if slots == n else slots, max(cols, length + self.headroom))
        for buf, r in zip(self._pool, presents, strict=True):
            buf[n, :, :length] = r[0]
            buf[n, :, length:] = 0  # as a new batch's padding: a departed row's columns go
        self.past = [buf[: n + 1] for buf in self._pool]

    def _slot_out(self, leaving: Sequence[int]) -> None:
        """Free the leaving rows' slots: the last row moves into each (one row copied per
        leaving row; the order of rows changes, which no row's answer depends on)."""
        for i in sorted(set(leaving), reverse=True):
            last = len(self.rows) - 1
            if i != last:
                for buf in self._pool:
                    buf[i] = buf[last]
                self.rows[i] = self.rows[last]
                self.positions[i], self.last[i] = self.positions[last], self.last[last]
            self.rows.pop()
            self.positions, self.last = self.positions[:last], self.last[:last]
        n = len(self.rows)
        self.past = [buf[:n] for buf in self._pool] if n else []

    def _resize(self, slots: int, cols: int) -> None:
        """A new pool of ``slots`` rows x ``cols`` columns holding the running rows' columns."""
        n = len(self.rows)
        keep = min(cols, self._pool[0].shape[2])
        pool = []
        for old in self._pool:
            new = np.zeros((slots, old.shape[1], cols, old.shape[3]), old.dtype)
            new[:n, :, :keep] = old[:n, :, :keep]
            pool.append(new)
        self._pool = pool
        self.past = [buf[:n] for buf in pool]


Batch = KVBatch | RightKVBatch


def new_batch(layout: str, headroom: int = 0) -> Batch:
    """An empty running batch for a graph of ``layout`` (:data:`LEFT` or :data:`RIGHT`);
    ``headroom``: see :class:`RightKVBatch`."""
    if layout == LEFT:
        return KVBatch()
    if layout == RIGHT:
        return RightKVBatch(headroom=headroom)
    raise ValueError(f"unknown cache layout {layout!r} (expected {LEFT!r} or {RIGHT!r})")


def _right_pad(p: np.ndarray, width: int) -> np.ndarray:
    return np.pad(p, ((0, 0), (0, 0), (0, width - p.shape[2]), (0, 0)))
