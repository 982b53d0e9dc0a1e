"""The generate client's wire helpers: SSE events, in-stream error classification, bodies."""

from __future__ import annotations

from pathlib import Path

import pytest

from tritonforge.client.errors import (
    InvalidRequestError,
    OverloadedError,
    ServerError,
    ServerUnavailableError,
)
from tritonforge.client.generate import (
    Chunk,
    _sse_event,
    http_body,
    sampling_parameters,
    stream_error,
)


def test_sse_events_become_chunks_and_errors_are_typed() -> None:
    assert _sse_event(b'data: {"text_output": "Hi"}', "ctx") == Chunk("Hi")
    final = _sse_event(b'data: {"text_output": "", "finish_reason": "length"}', "ctx")
    assert final == Chunk("", "length")
    assert _sse_event(b"", "ctx") is None and _sse_event(b": keep-alive", "ctx") is None
    with pytest.raises(OverloadedError, match="overloaded"):
        _sse_event(b'data: {"error": "generate: overloaded (16 running)"}', "ctx")


def test_stream_errors_and_request_shapes() -> None:
    assert isinstance(
        stream_error("text_input: the prompt has 9000 tokens", "c"), InvalidRequestError
    )
    assert isinstance(
        stream_error("generate: the server is shutting down", "c"), ServerUnavailableError
    )
    assert isinstance(stream_error("generate: decoder step failed", "c"), ServerError)
    params, stop = sampling_parameters(max_tokens=4, temperature=None, stop="END")
    assert params == {"max_tokens": 4} and stop == ["END"]
    assert http_body("hi", params, stop) == {
        "text_input": "hi",
        "parameters": {"max_tokens": 4},
        "stop": ["END"],
    }
    assert "stop" not in http_body("hi", {}, [])


def test_a_pinned_variant_is_discovered_from_the_repository_and_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``variant=`` resolves the model from the configs' ``tritonforge.*`` parameters (offline
    here: a repository named by ``$TRITONFORGE_MODEL_REPOSITORY``)."""
    from tritonforge.client.generate import GenerateClient
    from tritonforge.export.specs.smollm2 import smollm2_spec
    from tritonforge.tasks.generation.export.config import models, render_config

    spec = smollm2_spec()
    for variant, model in models(spec, int8=True).items():
        (tmp_path / model).mkdir()
        (tmp_path / model / "config.pbtxt").write_text(render_config(spec, variant, int8=True))
    monkeypatch.setenv("TRITONFORGE_MODEL_REPOSITORY", str(tmp_path))
    c = GenerateClient("localhost:1", protocol="http", variant="int8")
    assert c.model == models(spec, int8=True)["int8"]
    assert GenerateClient("localhost:1", protocol="http").model == spec.serving.model_name
    with pytest.raises(InvalidRequestError, match=r"variant.*int4"):
        GenerateClient("localhost:1", protocol="http", variant="int4")
    refused = stream_error("variant: model 'generate' serves variant 'fp32', not 'int8'", "c")
    assert isinstance(refused, InvalidRequestError)
