"""What every tritonforge locustfile shares: options (SLOs, pipeline, corpus), the round-robin
corpus, response validation, exact latency samples and the SLO gate at quit.

Importing this module registers the listeners; a locustfile imports it and defines users only.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from locust import events
from locust.env import Environment

from tritonforge.client.discovery import choose, route
from tritonforge.loadtest import corpus
from tritonforge.loadtest.locust import gevent_glue  # noqa: F401  (registers: gevent, gRPC, run time)
from tritonforge.loadtest.locust.options import add_options
from tritonforge.loadtest.slo import (
    SloThresholds,
    Summary,
    ValidationError,
    check_slos,
    summarize,
)
from tritonforge.pipelines import Pipeline

log = logging.getLogger("tritonforge.loadtest")
_TEXTS = corpus.generate()
_cursor = 0
_samples: list[tuple[float, float, bool]] = []  # (monotonic end time, latency ms, ok)
_window: dict[str, float] = {}
_pipelines: dict[str, Pipeline] = {}


def next_texts(n: int) -> list[str]:
    """The next ``n`` corpus texts (round robin shared by all users: same traffic every run)."""
    global _cursor
    out = [_TEXTS[(_cursor + i) % len(_TEXTS)] for i in range(n)]
    _cursor = (_cursor + n) % len(_TEXTS)
    return out


def bounded_network_timeout(user: Any, environment: Environment) -> None:
    """Give a FastHttpUser ``--request-timeout-s`` (its client reads it when it is built)."""
    options = getattr(environment, "parsed_options", None)
    if options is not None:
        user.network_timeout = options.request_timeout_s


def grpc_target(grpc_url: str, host: str | None) -> str:
    """``--grpc-url``, else the HTTP ``--host``'s hostname on Triton's default gRPC port 8001."""
    if grpc_url:
        return grpc_url.removeprefix("grpc://")
    hostname = urlsplit(host or "http://127.0.0.1").hostname or "127.0.0.1"
    return f"{hostname}:8001"


def check_json(response: Any, check: Callable[[Any], None]) -> None:
    """A FastHttpUser ``catch_response`` response: a failure unless it is 200 and ``check``
    accepts its JSON (:class:`ValidationError`, bad JSON or a missing key fail it)."""
    if response.status_code != 200:
        response.failure(f"HTTP {response.status_code}: {(response.text or '')[:200]}")
        return
    try:
        check(response.json())
    except (ValidationError, ValueError, KeyError) as e:
        response.failure(f"invalid response: {e}")


def fire_grpc(
    environment: Environment,
    name: str,
    start_s: float,
    length: int,
    exception: BaseException | None,
) -> None:
    """Report one gRPC call (started at ``perf_counter()`` ``start_s``) into Locust's stats."""
    environment.events.request.fire(
        request_type="grpc",
        name=name,
        response_time=(time.perf_counter() - start_s) * 1000.0,
        response_length=length,
        exception=exception,
        context={},
    )


def discovered(environment: Environment, task: str) -> Pipeline:
    """The pipeline to load (``--pipeline-name``, else the default of ``task``), discovered once per
    process: from ``--model-repository`` when given, else from the server's configs (the admin
    key ``$TRITONFORGE_ADMIN_KEY``; see :mod:`client.discovery`)."""
    from tritonforge.client.sync import EmbeddingClient

    options: Any = environment.parsed_options
    if not _pipelines:
        host = urlsplit(environment.host or "http://127.0.0.1:8000").netloc
        repository = options.model_repository or None
        bound = {"timeout_s": options.request_timeout_s, "deadline_s": options.request_timeout_s}
        with EmbeddingClient(host, "http", repository=repository, **bound) as client:
            _pipelines.update(client.pipelines())
    return choose(_pipelines, task, options.pipeline_name or None)


def target(environment: Environment, task: str) -> tuple[Pipeline, str, dict[str, str], str]:
    """(pipeline, model, request parameters, stats name suffix) of ``--pipeline``/``--variant``."""
    options: Any = environment.parsed_options
    pipeline = discovered(environment, task)
    model, parameters = route(pipeline, options.pipeline, options.variant)
    return pipeline, model, parameters, f"[{options.variant}]" if parameters else ""


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    add_options(parser)


@events.request.add_listener
def _record(response_time: float, exception: BaseException | None, **kwargs: Any) -> None:
    _samples.append((time.monotonic(), float(response_time), exception is None))


@events.test_start.add_listener
def _test_start(environment: Environment, **kwargs: Any) -> None:
    _window["start"] = time.monotonic()


@events.spawning_complete.add_listener
def _spawned(user_count: int, **kwargs: Any) -> None:
    _window.setdefault("spawned", time.monotonic())


@events.quitting.add_listener
def _quitting(environment: Environment, **kwargs: Any) -> None:
    options = environment.parsed_options
    if options is None:
        return
    if options.samples_out:
        begin = _window.get("spawned", _window.get("start", 0.0)) + options.warmup_s
        kept = [s for s in _samples if s[0] >= begin]
        summary: Summary = summarize(kept, begin, options.texts_per_request)
        Path(options.samples_out).write_text(json.dumps(summary.as_dict()))
    total = environment.stats.total
    thresholds = SloThresholds(
        p95_ms=options.slo_p95_ms,
        p99_ms=options.slo_p99_ms,
        min_rps=options.slo_min_rps,
        max_fail_ratio=options.slo_max_fail_ratio,
    )
    breaches = check_slos(
        thresholds,
        requests=total.num_requests,
        p95_ms=total.get_response_time_percentile(0.95) or 0.0,
        p99_ms=total.get_response_time_percentile(0.99) or 0.0,
        rps=total.total_rps,
        fail_ratio=total.fail_ratio,
    )
    if breaches:
        log.error("SLO BREACHED: %s", "; ".join(breaches))
        environment.process_exit_code = 1
    else:
        log.info(
            "SLO OK: p95 %.0f ms <= %g, p99 %.0f ms <= %g, %.1f rps >= %g, fail ratio %.4f <= %g",
            total.get_response_time_percentile(0.95) or 0.0,
            thresholds.p95_ms,
            total.get_response_time_percentile(0.99) or 0.0,
            thresholds.p99_ms,
            total.total_rps,
            thresholds.min_rps,
            total.fail_ratio,
            thresholds.max_fail_ratio,
        )
        environment.process_exit_code = 0
