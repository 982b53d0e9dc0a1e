"""The right-padded running batch's row slots (headroom > 0): joins copy one row, leaves move the
last row into the freed slot, and every row keeps exactly the columns the whole-batch copies
(headroom 0) give it."""

from __future__ import annotations

import numpy as np

from tritonforge.kv_batch import RightKVBatch


def _row(length: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, 2, length, 3)).astype(np.float32) for _ in range(2)]


def _columns(batch: RightKVBatch) -> dict[object, list[np.ndarray]]:
    return {
        seq: [p[i, :, : batch.positions[i]].copy() for p in batch.past]
        for i, seq in enumerate(batch.rows)
    }


def test_slots_keep_every_rows_columns_as_whole_batch_copies_do() -> None:
    rng = np.random.default_rng(7)
    pooled, copied = RightKVBatch(headroom=3), RightKVBatch()
    names = iter(range(1000))
    for step in range(60):
        if len(pooled) < 6 and rng.random() < 0.5:
            seq, length = next(names), int(rng.integers(1, 12))
            row = _row(length, seq)
            pooled.add(seq, row, length, 0)  # type: ignore[arg-type]
            copied.add(seq, row, length, 0)  # type: ignore[arg-type]
        if len(pooled) and rng.random() < 0.3:
            gone = {pooled.rows[int(k)] for k in rng.integers(0, len(pooled), 2)}
            pooled.remove([i for i, s in enumerate(pooled.rows) if s in gone])
            copied.remove([i for i, s in enumerate(copied.rows) if s in gone])
        if len(pooled):
            # the same token value per row in both: the seed is the row's name
            for b in (pooled, copied):
                mask = b.step_mask()
                presents = (
                    b.past
                    if b.headroom
                    else [np.concatenate([p, np.zeros_like(p[:, :, :1])], 2) for p in b.past]
                )
                for p in presents:
                    for i, pos in enumerate(b.positions):
                        p[i, :, pos] = float(b.rows[i]) + step  # type: ignore[arg-type]
                b.advance(presents, mask)
        a, b = _columns(pooled), _columns(copied)
        assert a.keys() == b.keys()
        for seq in a:
            for x, y in zip(a[seq], b[seq], strict=True):
                np.testing.assert_array_equal(x, y)
        if len(pooled):
            assert all(p.flags.c_contiguous for p in pooled.past)
            assert pooled.past[0].shape[2] > pooled.width  # room for the next column


def test_a_join_into_a_free_slot_and_a_leave_copy_no_other_row() -> None:
    batch = RightKVBatch(headroom=4)
    for k in range(4):
        batch.add(k, _row(3, k), 3, 0)  # type: ignore[arg-type]
    batch.remove([0, 1, 2, 3])
    batch.add(10, _row(3, 10), 3, 0)  # type: ignore[arg-type]
    pool = batch.past[0].base
    assert pool is not None and pool.shape[0] == 4  # the slots stay
    batch.add(11, _row(2, 11), 2, 0)  # type: ignore[arg-type]
    assert batch.past[0].base is pool  # a join into a free slot: no new pool
    np.testing.assert_array_equal(batch.past[0][1, :, :2], _row(2, 11)[0][0])
    assert not batch.past[0][1, :, 2:].any()  # the freed slot's old columns are cleared
    batch.remove([0])
    assert batch.rows == [11] and batch.past[0].base is pool  # the last row moved into slot 0
    np.testing.assert_array_equal(batch.past[0][0, :, :2], _row(2, 11)[0][0])
