"""Tracing settings (``serve --trace-otlp``) and the client's W3C trace context, without a server."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
from opentelemetry import trace

from tritonforge.client.errors import InvalidRequestError
from tritonforge.client.wire import TRACEPARENT, trace_headers
from tritonforge.runtime.cli import main as cli
from tritonforge.runtime.launcher.tracing import (
    TRACE_ENV,
    TraceConfigError,
    TraceSettings,
    trace_args,
    tracing_enabled,
)


def serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli._server_args(parser)
    return parser.parse_args(["--model-repository", str(Path("repo")), *argv])


@pytest.mark.parametrize(
    ("endpoint", "url"),
    [
        ("localhost:4318", "http://localhost:4318/v1/traces"),
        ("otel-collector:4318", "http://otel-collector:4318/v1/traces"),
        ("http://collector:4318", "http://collector:4318/v1/traces"),
        ("https://collector.example/v1/traces", "https://collector.example/v1/traces"),
    ],
)
def test_trace_endpoint_becomes_the_otlp_traces_url(endpoint: str, url: str) -> None:
    assert TraceSettings(endpoint).url == url
    assert f"--trace-config=opentelemetry,url={url}" in TraceSettings(endpoint).triton_args()


@pytest.mark.parametrize("endpoint", ["localhost", ":4318", "host:port", ""])
def test_bad_trace_endpoint_names_the_flag(endpoint: str) -> None:
    with pytest.raises(TraceConfigError, match="--trace-otlp"):
        TraceSettings(endpoint)


def test_bad_rate_and_level_are_refused() -> None:
    with pytest.raises(TraceConfigError, match="rate"):
        TraceSettings("h:1", rate=0)
    with pytest.raises(TraceConfigError, match="level"):
        TraceSettings("h:1", level="ALL")


def test_serve_flag_and_env_reach_the_triton_command_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(TRACE_ENV, raising=False)
    untraced = cli._settings(serve_args()).extra_args
    assert not [a for a in untraced if a.startswith("--trace-config")]
    args = cli._settings(serve_args("--trace-otlp", "127.0.0.1:4318", "--trace-rate", "10"))
    assert "--trace-config=mode=opentelemetry" in args.extra_args
    assert "--trace-config=rate=10" in args.extra_args
    monkeypatch.setenv(TRACE_ENV, "collector:4318")
    assert "--trace-config=opentelemetry,url=http://collector:4318/v1/traces" in trace_args(None)
    monkeypatch.setenv("TRITONFORGE_TRACE_RATE", "often")
    with pytest.raises(TraceConfigError, match="TRITONFORGE_TRACE_RATE"):
        trace_args(None)


W3C = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01")


def test_trace_headers_fresh_explicit_and_from_the_active_span() -> None:
    a, b = trace_headers()[TRACEPARENT], trace_headers()[TRACEPARENT]
    assert W3C.fullmatch(a) and W3C.fullmatch(b) and a != b
    given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert trace_headers(given) == {TRACEPARENT: given}
    context = trace.SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0x00F067AA0BA902B7,
        is_remote=False,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
    )
    with trace.use_span(trace.NonRecordingSpan(context)):
        assert trace_headers() == {
            TRACEPARENT: "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"
        }


@pytest.mark.parametrize("bad", ["", "00-abc-def-01", "00-" + "0" * 32 + "-" + "1" * 16 + "-01"])
def test_malformed_traceparent_is_an_invalid_request(bad: str) -> None:
    with pytest.raises(InvalidRequestError, match="traceparent"):
        trace_headers(bad)


def test_tracing_enabled_reads_the_triton_arguments() -> None:
    assert tracing_enabled(TraceSettings("localhost:4318").triton_args())
    assert not tracing_enabled(["--log-verbose=0"])
