"""The ONNX Runtime backend does not compute the padding every row of a batch shares (issue 20
item 2): the tokenizer pads each text to a multiple of 16 tokens, and a lone request must run at
its own length, as the in-process limit does (docs/performance.md, "Where the time goes").

A tiny graph reports the width it was run at, per row: a request padded to 16 positions must be
computed at its unpadded length, a merged batch at its longest row's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tritonforge.integrity import write_sidecar
from tritonforge.runtime.launcher.settings import ServerSettings
from tritonforge.runtime.serving import EmbeddedServer

pytestmark = pytest.mark.integration

CONFIG = """
name: "width"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "mask" data_type: TYPE_INT64 dims: [ -1 ] } ]
output [ { name: "width" data_type: TYPE_FP32 dims: [ 1 ] },
         { name: "tokens" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
parameters { key: "pad_values" value: { string_value: "mask=0" } }
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
"""


def width_graph(path: Path) -> None:
    """width[b] = the number of positions the graph was run at; tokens = the mask as floats."""
    import onnx
    from onnx import TensorProto, helper

    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    nodes = [
        helper.make_node("Equal", ["mask", "mask"], ["all"]),
        helper.make_node("Cast", ["all"], ["ones"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["ones", "axes"], ["width"], keepdims=1),
        helper.make_node("Cast", ["mask"], ["tokens"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(
        nodes,
        "width",
        [helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", "sequence"])],
        [
            helper.make_tensor_value_info("width", TensorProto.FLOAT, ["batch", 1]),
            helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["batch", "sequence"]),
        ],
        initializer=[axes],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


@pytest.fixture(scope="module")
def width_server(tmp_path_factory: pytest.TempPathFactory) -> EmbeddedServer:
    repo = tmp_path_factory.mktemp("repo")
    (repo / "width" / "1").mkdir(parents=True)
    (repo / "width" / "config.pbtxt").write_text(CONFIG)
    width_graph(repo / "width" / "1" / "model.onnx")
    write_sidecar(repo / "width" / "1" / "model.onnx")
    server = EmbeddedServer(ServerSettings.ephemeral(repo))
    server.start()
    server.wait_ready()
    yield server  # type: ignore[misc]
    server.stop()


def run(server: EmbeddedServer, lengths: list[int], padded_to: int) -> tuple[np.ndarray, ...]:
    mask = np.zeros((len(lengths), padded_to), np.int64)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    tensor = grpcclient.InferInput("mask", list(mask.shape), "INT64")
    tensor.set_data_from_numpy(mask)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        result = client.infer("width", [tensor])
    return result.as_numpy("width")[:, 0], result.as_numpy("tokens")  # type: ignore[union-attr]


def test_a_lone_request_runs_at_its_unpadded_length(width_server: EmbeddedServer) -> None:
    width, tokens = run(width_server, [3], padded_to=16)
    assert width.tolist() == [3.0]  # not the 16 the tokenizer's bucket pads to
    # Outputs along the sequence come back at the request's own (padded) shape.
    assert tokens.shape == (1, 16)
    assert tokens[0].tolist() == [1.0] * 3 + [0.0] * 13


def test_a_batch_runs_at_its_longest_row(width_server: EmbeddedServer) -> None:
    width, tokens = run(width_server, [3, 5, 1], padded_to=32)
    assert width.tolist() == [5.0, 5.0, 5.0]
    assert tokens.shape == (3, 32)
    assert tokens.sum(axis=1).tolist() == [3.0, 5.0, 1.0]


def test_an_unpadded_request_runs_as_it_is(width_server: EmbeddedServer) -> None:
    width, _ = run(width_server, [4], padded_to=4)
    assert width.tolist() == [4.0]
