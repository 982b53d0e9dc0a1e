"""OpenTelemetry tracing end to end: ``serve --trace-otlp`` arguments on the real embedded Triton,
an in-process OTLP/HTTP receiver on loopback, and the client's W3C ``traceparent`` (HTTP header,
gRPC metadata) parenting the server's spans."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator

import pytest
from opentelemetry import trace

from tests.conftest import PIPELINE_REPOSITORY
from tests.integration.otlp import OtlpReceiver, Span
from tritonforge.bls import build_plan
from tritonforge.client import EmbeddingClient
from tritonforge.pipelines import from_repository
from tritonforge.repository import load_model_config
from tritonforge.runtime.launcher.settings import ServerSettings
from tritonforge.runtime.launcher.tracing import TraceSettings
from tritonforge.runtime.serving import EmbeddedServer

pytestmark = pytest.mark.integration
DEFAULT = from_repository(PIPELINE_REPOSITORY)["embed"]  # the default embedding pipeline
BLS_MODEL = DEFAULT.model(bls=True)


@pytest.fixture(scope="module")
def traced() -> Iterator[tuple[EmbeddedServer, OtlpReceiver]]:
    with OtlpReceiver() as receiver:
        tracing = TraceSettings(endpoint=receiver.endpoint, rate=1, schedule_delay_ms=100)
        settings = ServerSettings.ephemeral(PIPELINE_REPOSITORY, extra_args=tracing.triton_args())
        with EmbeddedServer(settings) as server:
            yield server, receiver


def ensemble_stages(model: str) -> set[str]:
    """The ensemble's step models, read from its config.pbtxt (the contract)."""
    steps = load_model_config(PIPELINE_REPOSITORY, model).raw["ensemble_scheduling"]["step"]
    return {str(step["model_name"]) for step in steps}


def diagnosis(server: EmbeddedServer, receiver: OtlpReceiver) -> str:
    """What a failing assertion shows: every trace received and Triton's tracing log lines."""
    lines = [
        line
        for line in server.log_text().splitlines()
        if any(w in line.lower() for w in ("trac", "otlp", "opentelemetry", "export"))
    ]
    return f"{receiver.summary()}; tritonserver tracing log: {lines[-20:]}"


def root_of(spans: list[Span]) -> Span:
    ids = {s.span_id for s in spans}
    roots = [s for s in spans if s.parent_span_id not in ids]
    assert len(roots) == 1, f"expected one root span, got {roots}"
    return roots[0]


def assert_one_tree(spans: list[Span], parent_span_id: str) -> None:
    """Every span descends from one root whose parent is the client's span."""
    root = root_of(spans)
    assert root.parent_span_id == parent_span_id
    assert root.service == "tritonforge"


# Triton 2.51 now and then ignores the traceparent of a gRPC call (issue #23: the call is exported
# under a fresh, parentless trace; measured 5 of 30 through the front's shared upstream connection,
# rarer since the front gives a traced call a connection of its own, never over HTTP): a gRPC
# check sends up to this many calls, each with a new trace, and needs one whole parented trace.
ATTEMPTS = {"http": 1, "grpc": 3}


def parented_trace(
    send: Callable[[], tuple[str, str]], receiver: OtlpReceiver, until: set[str], attempts: int
) -> tuple[str, str, list[Span]]:
    """``send()`` one call and return its ``(trace_id, span_id)``; repeated (at most
    ``attempts`` times) until a trace holding every name in ``until`` arrived: the last call's
    ``(trace_id, span_id, spans)``."""
    for attempt in range(1, attempts + 1):
        trace_id, span_id = send()
        spans = receiver.trace(
            trace_id, until=until, timeout_s=30.0 if attempt == attempts else 10.0
        )
        if until <= {s.name for s in spans}:
            break
    return trace_id, span_id, spans


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_client_span_parents_one_trace_holding_every_ensemble_stage(
    traced: tuple[EmbeddedServer, OtlpReceiver], protocol: str
) -> None:
    server, receiver = traced
    model = DEFAULT.model("fp32")
    stages = ensemble_stages(model)
    url = server.http_url if protocol == "http" else server.grpc_url

    def send() -> tuple[str, str]:
        # A caller's OpenTelemetry span (opentelemetry-api only: a span context without an SDK).
        context = trace.SpanContext(
            trace_id=secrets.randbits(128),
            span_id=secrets.randbits(64),
            is_remote=False,
            trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
        )
        with (
            trace.use_span(trace.NonRecordingSpan(context)),
            EmbeddingClient(url, protocol, variant="fp32", pipeline="ensemble") as client,
        ):
            client.embed(["tracing through every stage"])
        trace_id, span_id = f"{context.trace_id:032x}", f"{context.span_id:016x}"
        assert client.last_traceparent == f"00-{trace_id}-{span_id}-01"
        return trace_id, span_id

    trace_id, span_id, spans = parented_trace(send, receiver, {model, *stages}, ATTEMPTS[protocol])
    names = {s.name for s in spans}
    assert {model, *stages} <= names, (
        f"spans of the trace {trace_id}: {sorted(names)}; {diagnosis(server, receiver)}"
    )
    assert_one_tree(spans, span_id)
    # each stage is a child of the ensemble's span
    ensemble = next(s for s in spans if s.name == model)
    assert {s.name for s in spans if s.parent_span_id == ensemble.span_id} >= stages


def test_bls_calls_join_the_callers_trace(traced: tuple[EmbeddedServer, OtlpReceiver]) -> None:
    """Without a caller span the client sends a fresh traceparent: still one named trace."""
    server, receiver = traced
    plan = build_plan(load_model_config(PIPELINE_REPOSITORY, BLS_MODEL), PIPELINE_REPOSITORY)
    stages = {plan.encoders["fp32"].model}  # the BLS tokenizes itself, then calls the encoder

    def send() -> tuple[str, str]:
        with EmbeddingClient(server.grpc_url, "grpc", pipeline="bls", variant="fp32") as client:
            client.embed(["a BLS request"])
            traceparent = client.last_traceparent
        assert traceparent is not None
        _, trace_id, span_id, _ = traceparent.split("-")
        return trace_id, span_id

    trace_id, span_id, spans = parented_trace(
        send, receiver, {BLS_MODEL, *stages}, ATTEMPTS["grpc"]
    )
    assert {BLS_MODEL, *stages} <= {s.name for s in spans}, (
        f"spans of the trace {trace_id}: {sorted(s.name for s in spans)}; "
        f"{diagnosis(server, receiver)}"
    )
    assert_one_tree(spans, span_id)
    # the BLS calls are children of the BLS model's span (request.trace() passed on)
    bls = next(s for s in spans if s.name == BLS_MODEL)
    assert {s.name for s in spans if s.parent_span_id == bls.span_id} >= stages
    assert receiver.rejected == []
