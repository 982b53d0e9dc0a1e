"""The remembered optimised graph (:mod:`tritonforge.ort_graphs`): saved on the first load,
loaded with optimisation off on the next, same outputs; a damaged copy is never used."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tritonforge import ort_graphs
from tritonforge.integrity import verify_sidecar, write_sidecar


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """x @ W + b, then Gelu-like ops ORT fuses (weights big enough for external data)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "B")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["m"]),
        helper.make_node("Add", ["m", "B"], ["a"]),
        helper.make_node("Relu", ["a"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 64])],
        [w, b],
    )
    path = tmp_path / "repo" / "model.onnx"
    path.parent.mkdir()
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    write_sidecar(path)
    return path


def _run(path: Path, cache: Path) -> tuple[np.ndarray, Path | None]:
    digest = verify_sidecar(path, required=True, cache_dir=cache)
    options = ort.SessionOptions()
    session = ort_graphs.session(ort, path, digest, options, {}, cache_root=cache)
    x = np.arange(3 * 64, dtype=np.float32).reshape(3, 64) / 100
    saved = [p for p in (cache / "ort").iterdir() if not p.name.startswith(".")]
    return session.run(None, {"x": x})[0], (saved[0] if saved else None)


def test_the_optimised_graph_is_saved_once_and_gives_the_same_outputs(
    model: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    first, saved = _run(model, cache)
    assert saved is not None and (saved / ort_graphs.GRAPH).is_file()
    assert (saved / (ort_graphs.WEIGHTS + ".sha256")).is_file()
    modified = (saved / ort_graphs.GRAPH).stat().st_mtime_ns
    second, again = _run(model, cache)
    assert again == saved and (saved / ort_graphs.GRAPH).stat().st_mtime_ns == modified
    np.testing.assert_array_equal(first, second)
    assert set(model.parent.iterdir()) == {model, model.with_name("model.onnx.sha256")}


def test_a_damaged_saved_graph_is_not_used(model: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first, saved = _run(model, cache)
    assert saved is not None
    weights = saved / ort_graphs.WEIGHTS
    data = bytearray(weights.read_bytes())
    data[100] ^= 0xFF
    weights.write_bytes(bytes(data))
    second, again = _run(model, cache)  # refused by its sidecar, rebuilt from the artifact
    np.testing.assert_array_equal(first, second)
    assert again is not None
    verify_sidecar(again / ort_graphs.WEIGHTS, required=True, cache=False)


def test_without_a_digest_nothing_is_saved(model: Path, tmp_path: Path) -> None:
    options = ort.SessionOptions()
    ort_graphs.session(ort, model, None, options, {}, cache_root=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()
