"""Bad input to every public model, over HTTP and gRPC: a 4xx / INVALID_ARGUMENT naming the field,
no traceback, no shared-memory key in any body, and the server (same stub PIDs) keeps serving."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tritonforge.runtime.serving import EmbeddedServer

pytestmark = pytest.mark.integration

PUBLIC_MODELS = ["embed", "embed_int8", "embed_torchscript", "embed_bls"]


@dataclass(frozen=True)
class Case:
    name: str
    input_name: str
    datatype: str
    value: np.ndarray
    expect: str  # a fragment the error message must contain (the field, the limit...)


def texts(*items: bytes) -> np.ndarray:
    return np.array([[t] for t in items], dtype=np.object_)


CASES = [
    Case("wrong dtype", "text", "INT32", np.zeros((1, 1), np.int32), "text"),
    Case("wrong shape", "text", "BYTES", np.array([[b"a", b"b"]], dtype=np.object_), "text"),
    Case("unknown input", "txt", "BYTES", texts(b"hello"), "txt"),
    # rejected by Triton itself, before any model runs: its message names the batch size
    Case("batch above max", "text", "BYTES", texts(*[b"x"] * 65), "batch-size must be <= 64"),
    Case("empty text", "text", "BYTES", texts(b""), "text"),
    Case("whitespace text", "text", "BYTES", texts(b" \t\n "), "text"),
    Case("non-UTF-8 text", "text", "BYTES", texts(b"caf\xe9 \xff"), "text"),
    Case("1 MB text", "text", "BYTES", texts(b"word " * 200_000), "text"),
    # content-free: all tokenized to nothing and got one identical vector
    Case("NUL text", "text", "BYTES", texts(b"\x00"), "control character U+0000"),
    Case("zero-width text", "text", "BYTES", texts("\u200b".encode()), "no letter"),
    Case("control chars", "text", "BYTES", texts(b"\x01\x02\x7f"), "control character"),
    Case(
        "one bad item among good ones", "text", "BYTES", texts(b"fine", b"", b"also fine"), "item 1"
    ),
]


def send(protocol: str, url: str, model: str, case: Case | None) -> object:
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(url)  # type: ignore[attr-defined]
    inputs = []
    if case is not None:
        tensor = module.InferInput(case.input_name, list(case.value.shape), case.datatype)  # type: ignore[attr-defined]
        tensor.set_data_from_numpy(case.value)
        inputs.append(tensor)
    try:
        return client.infer(model, inputs)
    finally:
        client.close()


@pytest.fixture(scope="module")
def stub_pids(pipeline_server: EmbeddedServer) -> Iterator[dict[str, int]]:
    before = pipeline_server.stub_pids()
    assert before, "no Python stubs found"
    yield before
    assert pipeline_server.stub_pids() == before, "a stub process was replaced"
    assert pipeline_server.returncode is None


def assert_clean_client_error(error: InferenceServerException, protocol: str, expect: str) -> None:
    message = error.message() or ""
    status = str(error.status())
    if protocol == "http":
        assert status.startswith("4") or status == "None", f"HTTP status {status}: {message}"
    else:
        assert status == "StatusCode.INVALID_ARGUMENT", f"{status}: {message}"
    assert expect in message, message
    assert "Traceback" not in message and 'File "' not in message, message
    assert "tritonforge_" not in message, f"shared-memory key leaked: {message}"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", PUBLIC_MODELS)
def test_bad_input_is_a_clear_client_error(
    pipeline_server: EmbeddedServer,
    stub_pids: dict[str, int],
    model: str,
    protocol: str,
    case: Case,
) -> None:
    url = pipeline_server.http_url if protocol == "http" else pipeline_server.grpc_url
    with pytest.raises(InferenceServerException) as info:
        send(protocol, url, model, case)
    assert_clean_client_error(info.value, protocol, case.expect)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", PUBLIC_MODELS)
def test_missing_input_is_a_clear_client_error(
    pipeline_server: EmbeddedServer, stub_pids: dict[str, int], model: str, protocol: str
) -> None:
    url = pipeline_server.http_url if protocol == "http" else pipeline_server.grpc_url
    with pytest.raises(InferenceServerException) as info:
        send(protocol, url, model, None)
    assert_clean_client_error(info.value, protocol, "text")


@pytest.mark.parametrize("model", PUBLIC_MODELS)
def test_server_still_serves_after_bad_input(
    pipeline_server: EmbeddedServer, stub_pids: dict[str, int], model: str
) -> None:
    result = send(
        "grpc",
        pipeline_server.grpc_url,
        model,
        Case("ok", "text", "BYTES", texts(b"still here"), ""),
    )
    embedding = result.as_numpy("embedding")  # type: ignore[attr-defined]
    assert embedding.shape == (1, 384)
    assert abs(float(np.linalg.norm(embedding)) - 1.0) < 1e-4
