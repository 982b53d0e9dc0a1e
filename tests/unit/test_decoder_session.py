"""OrtDecoder passes ONNX Runtime session config entries (``session.*`` config parameters) and
reads the cache layout from the graph (``position_ids`` an input: left-padded, else right)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tritonforge.decoder import OrtDecoder
from tritonforge.errors import ModelConfigError
from tritonforge.kv_batch import LEFT, RIGHT


def tiny_decoder(path: Path, positions: bool = True, head: int | str = 2) -> Path:
    """A graph with the KV-decoder interface (one layer, 1 head x ``head``): logits = ids as
    float, presents = pasts; ``positions=False``: no ``position_ids`` input (a right-padded
    graph such as GroupQueryAttention's)."""
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["b", "t"])
    pos = helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["b", "s"])
    kv = ["b", 1, "p", head]
    pasts = [
        helper.make_tensor_value_info(f"past_key_values.0.{k}", TensorProto.FLOAT, kv)
        for k in ("key", "value")
    ]
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", "s", 1])
    presents = [
        helper.make_tensor_value_info(f"present.0.{k}", TensorProto.FLOAT, kv)
        for k in ("key", "value")
    ]
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [2])
    nodes = [
        helper.make_node("Cast", ["input_ids"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["f", "axes"], ["logits"]),
        helper.make_node("Identity", ["past_key_values.0.key"], ["present.0.key"]),
        helper.make_node("Identity", ["past_key_values.0.value"], ["present.0.value"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [ids, mask, *([pos] if positions else []), *pasts],
        [logits, *presents],
        initializer=[axes],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return path


def test_session_config_entries_reach_onnx_runtime(tmp_path: Path) -> None:
    path = tiny_decoder(tmp_path / "decoder.onnx")
    dec = OrtDecoder(path, 1, {"session.use_env_allocators": "1"})
    options = dec.session.get_session_options()
    assert options.get_session_config_entry("session.use_env_allocators") == "1"
    ids = np.array([[3, 4]], np.int64)
    logits, presents = dec(ids, np.ones_like(ids), np.arange(2)[None], dec.empty_past())
    assert logits.shape == (1, 2, 1) and logits[0, 1, 0] == 4.0 and len(presents) == 2


def test_spinning_is_off_by_default_and_a_config_entry_turns_it_back_on(tmp_path: Path) -> None:
    path = tiny_decoder(tmp_path / "decoder.onnx")
    options = OrtDecoder(path, 1).session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    on = OrtDecoder(path, 1, {"session.intra_op.allow_spinning": "1"})
    assert (
        on.session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning")
        == "1"
    )
    with pytest.raises(RuntimeError, match="does not have configuration"):
        options.get_session_config_entry("session.use_env_allocators")


def test_the_cache_layout_is_read_from_the_graph(tmp_path: Path) -> None:
    left = OrtDecoder(tiny_decoder(tmp_path / "left.onnx"), 1)
    right = OrtDecoder(tiny_decoder(tmp_path / "right.onnx", positions=False), 1)
    assert (left.layout, right.layout) == (LEFT, RIGHT)
    ids = np.array([[3, 4]], np.int64)
    # position_ids is fed only to a graph that has it (ONNX Runtime refuses unknown inputs)
    logits, _ = right(ids, np.ones_like(ids), np.arange(2)[None], right.empty_past())
    assert logits[0, 1, 0] == 4.0


def test_a_symbolic_head_axis_is_a_clear_error(tmp_path: Path) -> None:
    path = tiny_decoder(tmp_path / "d.onnx", positions=False, head="kv_cache_dim")
    with pytest.raises(ModelConfigError, match="must be concrete"):
        OrtDecoder(path, 1)


def test_in_place_steps_only_for_a_right_padded_decode_step_with_room(tmp_path: Path) -> None:
    left = OrtDecoder(tiny_decoder(tmp_path / "left.onnx"), 1)
    right = OrtDecoder(tiny_decoder(tmp_path / "right.onnx", positions=False), 1)
    one, mask = np.array([[3]], np.int64), np.ones((1, 4), np.int64)
    room = [np.zeros((1, 1, 8, 2), np.float32) for _ in right.past]
    exact = [np.zeros((1, 1, 3, 2), np.float32) for _ in right.past]
    assert right.in_place(one, mask, room) and not left.in_place(one, mask, room)
    assert not right.in_place(one, mask, exact)  # no room: a new present
    two = np.array([[3, 4]], np.int64)  # several new tokens: in place at batch 1 only
    assert right.in_place(two, mask, room)
    assert not right.in_place(
        np.repeat(two, 2, 0), np.repeat(mask, 2, 0), [np.repeat(p, 2, 0) for p in room]
    )
    assert (right.kv_headroom > 0, left.kv_headroom) == (True, 0)
    logits, presents = right(one, mask, np.array([[3]]), room)
    assert presents[0] is room[0] and logits[0, 0, 0] == 3.0  # the same buffers come back


def test_the_binding_is_kept_for_the_same_buffers_and_made_anew_for_others(tmp_path: Path) -> None:
    right = OrtDecoder(tiny_decoder(tmp_path / "right.onnx", positions=False), 1)
    room = [np.zeros((1, 1, 8, 2), np.float32) for _ in right.past]
    first, _ = right(np.array([[3]]), np.ones((1, 4), np.int64), np.array([[3]]), room)
    kept = right._bound
    second, _ = right(np.array([[5]]), np.ones((1, 5), np.int64), np.array([[4]]), room)
    assert right._bound is kept  # the same buffers: the same binding, only the ids rebound
    assert (first[0, 0, 0], second[0, 0, 0]) == (3.0, 5.0)  # each step's own logits
    other = [p.copy() for p in room]
    third, presents = right(np.array([[7]]), np.ones((1, 5), np.int64), np.array([[4]]), other)
    assert right._bound is not kept and presents[0] is other[0] and third[0, 0, 0] == 7.0
    room[0] = room[0].copy()  # one buffer of a list replaced: never the old binding
    right(np.array([[9]]), np.ones((1, 5), np.int64), np.array([[4]]), room)
    assert right._bound is not None and right._bound[0][0] is room[0]
