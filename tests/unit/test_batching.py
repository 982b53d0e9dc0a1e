"""Merge / pad / split of the requests one ``execute`` call receives."""

from __future__ import annotations

import numpy as np
import pytest

from tritonforge.batching import plan_batches, split_outputs, validate_inputs
from tritonforge.errors import InvalidInputError
from tritonforge.modelconfig import ModelConfig

CONFIG = ModelConfig.from_json(
    {
        "name": "enc",
        "max_batch_size": 4,
        "input": [
            {"name": "ids", "data_type": "TYPE_INT64", "dims": [-1]},
            {"name": "mask", "data_type": "TYPE_INT64", "dims": [-1]},
        ],
        "output": [{"name": "out", "data_type": "TYPE_FP32", "dims": [-1, 2]}],
    }
)
AXES = {
    "ids": ["batch_size", "sequence_length"],
    "mask": ["batch_size", "sequence_length"],
    "out": ["batch_size", "sequence_length", None],
}


def req(rows: int, length: int, start: int = 1) -> dict[str, np.ndarray]:
    ids = np.arange(start, start + rows * length, dtype=np.int64).reshape(rows, length)
    return {"ids": ids, "mask": np.ones_like(ids)}


def fake_model(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """out[b, s] = (ids, ids * mask): row-wise, so padding is visible if not cut back."""
    ids = inputs["ids"].astype(np.float32)
    return {"out": np.stack([ids, ids * inputs["mask"]], axis=-1)}


def test_padded_merge_is_one_batch_and_split_restores_each_request() -> None:
    requests = [(0, req(1, 3)), (1, req(2, 5, start=100)), (2, req(1, 1, start=7))]
    batches = plan_batches(requests, {"ids": 0, "mask": 0}, AXES)
    assert len(batches) == 1
    batch = batches[0]
    assert batch.inputs["ids"].shape == (4, 5)
    assert batch.size == 4
    # padding uses the declared pad value
    assert batch.inputs["mask"][0].tolist() == [1, 1, 1, 0, 0]
    parts = dict(split_outputs(fake_model(batch.inputs), batch, AXES))
    for index, original in requests:
        expected = fake_model(dict(original))["out"]
        np.testing.assert_array_equal(parts[index]["out"], expected)


def test_without_pad_values_requests_are_grouped_by_shape() -> None:
    requests = [(0, req(1, 3)), (1, req(1, 4)), (2, req(2, 3)), (3, req(1, 4))]
    batches = plan_batches(requests, None, AXES)
    assert sorted(b.size for b in batches) == [2, 3]
    for batch in batches:
        assert len({m.axis_sizes["sequence_length"] for m in batch.members}) == 1
    got = {}
    for batch in batches:
        got.update(dict(split_outputs(fake_model(batch.inputs), batch, AXES)))
    for index, original in requests:
        np.testing.assert_array_equal(got[index]["out"], fake_model(dict(original))["out"])


def test_same_shapes_merge_without_padding() -> None:
    batches = plan_batches([(0, req(1, 3)), (1, req(3, 3))], None, AXES)
    assert len(batches) == 1 and batches[0].inputs["ids"].shape == (4, 3)


def test_empty_plan() -> None:
    assert plan_batches([], {"ids": 0}, AXES) == []


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"ids": np.ones((1, 3), np.int64)}, "'mask' is missing"),
        ({**req(1, 3), "extra": np.ones((1, 3), np.int64)}, "unexpected input 'extra'"),
        (
            {"ids": np.ones((1, 3), np.int32), "mask": np.ones((1, 3), np.int64)},
            "'ids' must be INT64",
        ),
        (
            {"ids": np.ones((3,), np.int64), "mask": np.ones((3,), np.int64)},
            "'ids' must have rank 2",
        ),
        ({"ids": np.ones((0, 3), np.int64), "mask": np.ones((0, 3), np.int64)}, "empty batch"),
        ({"ids": np.ones((5, 3), np.int64), "mask": np.ones((5, 3), np.int64)}, "max_batch_size 4"),
        ({"ids": np.ones((2, 3), np.int64), "mask": np.ones((1, 3), np.int64)}, "has batch 1"),
    ],
)
def test_validation_names_the_field(inputs: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        validate_inputs(CONFIG, inputs)


def test_fixed_dims_are_enforced() -> None:
    config = ModelConfig.from_json(
        {
            "name": "m",
            "max_batch_size": 2,
            "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [3]}],
        }
    )
    validate_inputs(config, {"x": np.zeros((2, 3), np.float32)})
    with pytest.raises(InvalidInputError, match="'x' axis 1 must be 3"):
        validate_inputs(config, {"x": np.zeros((2, 4), np.float32)})
