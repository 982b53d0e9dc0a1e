"""runtime.front.guard: defensive header parsing, bounded echoes, the throttled error log,
stream admission and the version-pin policy (issue #19 findings 2b, 6, 7)."""

from __future__ import annotations

import logging

import pytest

from tritonforge.errors import shown
from tritonforge.runtime.errors import FrontError
from tritonforge.runtime.front.guard import (
    Admission,
    PinPolicy,
    ThrottledLog,
    check_model_name,
    parse_header_length,
    parse_version,
)

HOSTILE = ["²", "1²", "٣", "-1", "1e3", " ", "0x10", "1" * 5000, "9" * 13]


@pytest.mark.parametrize("value", HOSTILE, ids=lambda v: repr(v)[:12])
def test_header_length_refuses_what_int_and_isdigit_disagree_on(value: str) -> None:
    with pytest.raises(FrontError, match="Inference-Header-Content-Length") as err:
        parse_header_length(value, 10**15, "Inference-Header-Content-Length")
    assert err.value.status == 400
    assert len(str(err.value)) < 200


def test_header_length_must_lie_within_the_body() -> None:
    assert parse_header_length(" 12 ", 12, "H") == 12
    with pytest.raises(FrontError, match="within the body"):
        parse_header_length("13", 12, "H")


@pytest.mark.parametrize("value", [*HOSTILE, "0", "1234567890"], ids=lambda v: repr(v)[:12])
def test_versions_are_small_positive_ascii_integers(value: str) -> None:
    with pytest.raises(FrontError, match="X-Model-Version") as err:
        parse_version(value, "X-Model-Version")
    assert err.value.status == 400 and len(str(err.value)) < 200


def test_a_good_version_parses() -> None:
    assert parse_version("007", "v") == 7


def test_shown_cuts_long_values_and_says_how_long() -> None:
    assert shown("abc") == "'abc'"
    text = shown("v" * 10_000)
    assert "v" * 41 not in text and "10000 bytes" in text
    assert len(shown("é" * 100).encode()) < 80  # cut on a character boundary, bytes counted


def test_long_model_names_are_refused_without_echoing_them() -> None:
    check_model_name("embed")
    with pytest.raises(FrontError) as err:
        check_model_name("m" * 10_000)
    assert err.value.status == 400 and "m" * 64 not in str(err.value)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_throttled_log_writes_once_per_kind_per_interval_with_a_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    throttled = ThrottledLog(logging.getLogger("t"), interval_s=60, clock=clock)
    with caplog.at_level(logging.WARNING, logger="t"):
        for _ in range(1000):
            throttled.record("http 400", "bad header")
        throttled.record("http 413", "too big")
        assert len(caplog.records) == 2  # the first of each kind, at once
        assert throttled.pending("http 400") == 999
        clock.now = 61
        throttled.record("http 400", "bad header")
        assert len(caplog.records) == 3
        assert "1000 more in the last 61 s" in caplog.records[-1].getMessage()
        throttled.record("http 400", "bad header")
        throttled.flush()
    assert "1 more" in caplog.records[-1].getMessage()
    assert not any(r.exc_info for r in caplog.records)


def test_admission_bounds_streams_and_ends_them_on_drain() -> None:
    admission = Admission(max_open_streams=2)
    ended: list[str] = []
    first = admission.open_stream(ended.append)
    second = admission.open_stream(ended.append)
    assert first is not None and second is not None
    assert admission.open_stream(ended.append) is None
    assert "max_open_streams=2" in admission.full_message()
    admission.close_stream(first)
    assert admission.open_streams == 1
    admission.short = 1
    admission.begin_drain("the server is shutting down")
    assert ended == ["the server is shutting down"] and admission.draining
    assert not admission.idle()
    admission.short, _ = 0, admission.close_stream(second)
    assert admission.idle()


def _config(name: str, versions: str | None = None) -> dict[str, object]:
    params = {"versions": {"string_value": versions}} if versions is not None else {}
    return {"name": name, "parameters": params}


def test_pins_are_honoured_where_declared_and_refused_elsewhere_naming_where() -> None:
    policy = PinPolicy.from_configs(
        [_config("classify"), _config("classify_bls", "1,2"), _config("embed_bls", "")]
    )
    policy.check("classify_bls", "X-Model-Version")
    policy.check("not_served", "X-Model-Version")  # Triton answers an unknown model itself
    for model in ("classify", "embed_bls"):
        with pytest.raises(FrontError, match="pinning works on: classify_bls") as err:
            policy.check(model, "X-Model-Version")
        assert err.value.status == 400 and "X-Model-Version" in str(err.value)


def test_front_helpers_find_the_model_the_pin_and_write_sse_like_triton() -> None:
    from tritonforge.runtime.front.body import json_has_version
    from tritonforge.runtime.front.http import _model_of
    from tritonforge.runtime.front.sse import sse_event

    assert _model_of("/v2/models/classify/versions/1/infer") == "classify"
    assert _model_of("/v2/health/ready") is None
    body = b'{"parameters": {"version": 2}, "inputs": []}'
    assert json_has_version(None, body)
    assert json_has_version(str(len(body)), body + b"\x00raw")
    assert not json_has_version(None, b'{"inputs": [{"name": "version"}]}')
    assert not json_has_version(None, b'{"parameters": {"version": 1' + b"9" * 5000 + b"}}")
    assert sse_event({"error": "x"}) == b'data: {"error":"x"}\n\n'


def test_each_model_has_its_own_stream_bound_from_its_config() -> None:
    from tritonforge.runtime.front.guard import stream_capacities

    def decoupled(name: str, **params: str) -> dict[str, object]:
        return {
            "name": name,
            "model_transaction_policy": {"decoupled": True},
            "parameters": {k: {"string_value": v} for k, v in params.items()},
        }

    configs = [
        decoupled("generate", max_running="2", max_queue="1"),
        decoupled("generate_int8", max_running="16", max_queue="64"),
        decoupled("echo"),  # declares nothing: max_open_streams
        {"name": "embed", "parameters": {"max_running": {"string_value": "9"}}},  # not decoupled
    ]
    admission = Admission(max_open_streams=4)
    admission.capacities = stream_capacities(configs)
    assert admission.capacities == {"generate": 3, "generate_int8": 80}
    assert [admission.bound(m) for m in ("generate", "generate_int8", "echo")] == [3, 4, 4]
    ended: list[str] = []
    int8 = [admission.open_stream(ended.append, "generate_int8") for _ in range(4)]
    assert None not in int8 and admission.open_stream(ended.append, "generate_int8") is None
    assert "generate_int8: overloaded: 4 streams open, its bound is 4" in admission.full_message(
        "generate_int8"
    )
    gen = [admission.open_stream(ended.append, "generate") for _ in range(3)]
    assert None not in gen and admission.open_stream(ended.append, "generate") is None
    assert "its config admits 3: max_running + max_queue" in admission.full_message("generate")
    # a gRPC stream names its model with its first request: refused there when that one is full
    pending = admission.open_stream(ended.append)
    assert pending is not None and not admission.stream_model(pending, "generate")
    assert admission.stream_model(pending, "echo")
    # a tracked request (non-streamed /v1) holds no slot but is ended with the streams
    tracked = admission.track(ended.append, "generate")
    assert admission.open_streams == 8
    assert admission.end_streams(["generate"], "crashed") == 4 and ended == ["crashed"] * 4
    admission.close_stream(tracked)
    assert 'tritonforge_front_open_streams{model="generate"} 3' in admission.metrics()


def test_sse_events_are_written_as_triton_writes_them() -> None:
    from tritonclient.grpc import service_pb2

    from tritonforge.runtime.front.sse import dumps, response_event

    assert dumps({"error": 'a"\\\n\x01é'}) == b'{"error":"a\\"\\\\\\n\\u0001\xc3\xa9"}'
    response = service_pb2.ModelInferResponse(model_name="generate", model_version="1")
    response.parameters["triton_final_response"].bool_param = True
    response.parameters["seq"].int64_param = 2
    for name, values in (("text_output", [b"hi"]), ("finish_reason", [b"stop"])):
        out = response.outputs.add(name=name, datatype="BYTES", shape=[1])
        response.raw_output_contents.append(
            b"".join(len(v).to_bytes(4, "little") + v for v in values)
        )
        assert out.name == name
    assert response_event(response) == (
        b'data: {"finish_reason":"stop","model_name":"generate","model_version":"1",'
        b'"seq":2,"text_output":"hi"}\n\n'
    )
    flag_only = service_pb2.ModelInferResponse()
    flag_only.parameters["triton_final_response"].bool_param = True
    assert response_event(flag_only) is None
