"""Merge / pad / split of the requests one ``execute`` call receives."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tritonforge.batching import (
    batch_extents,
    infer_rows,
    infer_trimmed,
    plan_batches,
    row_extents,
    rows_alone,
    split_outputs,
    validate_inputs,
)
from tritonforge.errors import InvalidInputError, ModelConfigError
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


def _per_tensor_scaled(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A stand-in for dynamic int8: every value is rounded on a grid set by the batch's max
    (padding included), then pooled over the valid positions; a named per-token output too."""
    x = feed["x"].astype(np.float64)
    scale = np.abs(x).max() / 127 or 1.0
    q = np.round(x / scale) * scale
    mask = feed["mask"]
    pooled = (q * mask).sum(1) / np.maximum(mask.sum(1), 1)
    return {"pooled": pooled[:, None], "tokens": q}


ROW_AXES = {
    "x": ["batch", "sequence"],
    "mask": ["batch", "sequence"],
    "pooled": ["batch", None],
    "tokens": ["batch", "sequence"],
}
PADS = {"x": 0, "mask": 0}


def _rows(*rows: list[float]) -> dict[str, np.ndarray]:
    width = max(len(r) for r in rows)
    x = np.zeros((len(rows), width))
    mask = np.zeros((len(rows), width), np.int64)
    for i, r in enumerate(rows):
        x[i, : len(r)], mask[i, : len(r)] = r, 1
    return {"x": x, "mask": mask}


def test_infer_rows_makes_a_rows_answer_independent_of_its_batch() -> None:
    text, other = [0.3, 0.71, 0.2], [9.0, 1.0, 3.0, 7.5, 2.0]
    alone = _per_tensor_scaled(_rows(text))["pooled"][0]
    batched = _per_tensor_scaled(_rows(text, other))["pooled"][0]
    assert alone != batched  # the stand-in couples rows, as per-tensor dynamic int8 does
    rowwise = infer_rows(_rows(text, other), _per_tensor_scaled, PADS, ROW_AXES)
    assert (
        rowwise["pooled"][0]
        == infer_rows(_rows(text), _per_tensor_scaled, PADS, ROW_AXES)["pooled"][0]
    )
    assert rowwise["pooled"][1] == _per_tensor_scaled(_rows(other))["pooled"][0]
    # Named per-token outputs come back at the batch's width (zeros past a row's own length).
    assert rowwise["tokens"].shape == (2, 5)
    assert rowwise["tokens"][0, 3:].tolist() == [0.0, 0.0]


def test_row_extents_trim_only_trailing_padding() -> None:
    feed = _rows([1.0, 0.0, 2.0], [1.0])  # a real zero inside row 0 is kept
    assert row_extents(feed, 0, PADS, ROW_AXES) == {"sequence": 3}
    assert row_extents(feed, 1, PADS, ROW_AXES) == {"sequence": 1}
    feed["mask"][1, :] = 0  # an all-padding row still runs with one position
    feed["x"][1, :] = 0
    assert row_extents(feed, 1, PADS, ROW_AXES) == {"sequence": 1}


def _padded(feed: dict[str, np.ndarray], width: int) -> dict[str, np.ndarray]:
    """``feed`` with trailing padding up to ``width`` (what the tokenizer's 16-token bucket adds)."""
    return {n: np.pad(a, [(0, 0), (0, width - a.shape[1])]) for n, a in feed.items()}


def test_infer_trimmed_runs_the_batch_at_its_longest_row() -> None:
    seen: list[tuple[int, ...]] = []

    def model(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        seen.append(feed["x"].shape)
        return _per_tensor_scaled(feed)

    feed = _padded(_rows([0.3, 0.71, 0.2], [9.0, 0.0, 3.0, 7.5, 2.0]), 16)
    out = infer_trimmed(feed, model, PADS, ROW_AXES)
    assert seen == [(2, 5)]  # the 11 columns of shared padding are not computed
    assert batch_extents(feed, PADS, ROW_AXES) == {"sequence": 5}
    # The answer is the unpadded batch's, and named outputs come back at the input's width.
    unpadded = _per_tensor_scaled(_rows([0.3, 0.71, 0.2], [9.0, 0.0, 3.0, 7.5, 2.0]))
    assert out["pooled"].tolist() == unpadded["pooled"].tolist()
    assert out["tokens"].shape == (2, 16)
    assert out["tokens"][:, :5].tolist() == unpadded["tokens"].tolist()
    assert not out["tokens"][:, 5:].any()


def test_infer_trimmed_keeps_what_is_not_shared_padding() -> None:
    feed = _padded(_rows([1.0, 0.0, 0.0]), 4)
    feed["mask"][0, :3] = 1  # zeros inside the mask's span are real tokens
    calls: list[tuple[int, ...]] = []
    infer_trimmed(feed, lambda f: calls.append(f["x"].shape) or {"y": f["x"]}, PADS, ROW_AXES)
    assert calls == [(1, 3)]
    unpadded = _rows([1.0, 2.0])  # no padding at all: the batch runs as it is, not copied
    same: list[bool] = []
    infer_trimmed(unpadded, lambda f: same.append(f["x"] is unpadded["x"]) or {}, PADS, ROW_AXES)
    assert same == [True]
    # An input without a pad value is never cut.
    extents = batch_extents(_padded(_rows([1.0]), 4), {"mask": 0}, {"x": ROW_AXES["x"]})
    assert extents == {}


def test_rows_alone_is_decided_from_the_graph(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    def save(op: str, name: str) -> Path:
        outputs = ["y", "s", "z"] if op == "DynamicQuantizeLinear" else ["y"]
        node = helper.make_node(op, ["x"], outputs)
        graph = helper.make_graph(
            [node],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])],
            [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs],
        )
        path = tmp_path / name
        onnx.save(helper.make_model(graph), str(path))
        return path

    dynamic, plain = save("DynamicQuantizeLinear", "dyn.onnx"), save("Relu", "relu.onnx")
    assert rows_alone(dynamic, "auto") and not rows_alone(plain, "auto")
    assert rows_alone(plain, "alone") and not rows_alone(dynamic, "together")
    with pytest.raises(ModelConfigError, match="batch_rows"):
        rows_alone(plain, "sometimes")
