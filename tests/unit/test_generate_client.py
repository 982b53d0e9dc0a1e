"""The generate client's wire helpers: SSE events, in-stream error classification, bodies."""

from __future__ import annotations

import pytest

from tritonforge.client.errors import InvalidRequestError, ServerError, ServerUnavailableError
from tritonforge.client.generate import Chunk, _sse_event, classify, http_body, sampling_parameters


def test_sse_events_become_chunks_and_errors_are_typed() -> None:
    assert _sse_event(b'data: {"text_output": "Hi"}', "ctx") == Chunk("Hi")
    final = _sse_event(b'data: {"text_output": "", "finish_reason": "length"}', "ctx")
    assert final == Chunk("", "length")
    assert _sse_event(b"", "ctx") is None and _sse_event(b": keep-alive", "ctx") is None
    with pytest.raises(ServerUnavailableError, match="overloaded"):
        _sse_event(b'data: {"error": "generate: overloaded (16 running)"}', "ctx")


def test_classify_and_request_shapes() -> None:
    assert isinstance(classify("text_input: the prompt has 9000 tokens", "c"), InvalidRequestError)
    assert isinstance(
        classify("generate: the server is shutting down", "c"), ServerUnavailableError
    )
    assert isinstance(classify("generate: decoder step failed", "c"), ServerError)
    params, stop = sampling_parameters(max_tokens=4, temperature=None, stop="END")
    assert params == {"max_tokens": 4} and stop == ["END"]
    assert http_body("hi", params, stop) == {
        "text_input": "hi",
        "parameters": {"max_tokens": 4},
        "stop": ["END"],
    }
    assert "stop" not in http_body("hi", {}, [])
