"""What every tritonforge locustfile shares: options (SLOs, pipeline, corpus), the round-robin
corpus, response validation, exact latency samples and the SLO gate at quit.

Importing this module registers the listeners; a locustfile imports it and defines users only.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc.experimental.gevent as grpc_gevent
from locust import events
from locust.env import Environment

from tritonforge.loadtest import corpus
from tritonforge.loadtest.locust_options import add_options
from tritonforge.loadtest.slo import SloThresholds, Summary, check_slos, summarize

# gRPC's C core must cooperate with gevent (Locust's concurrency), or a blocking call stalls
# every user. Must run before any channel exists.
grpc_gevent.init_gevent()

log = logging.getLogger("tritonforge.loadtest")
_TEXTS = corpus.generate()
_cursor = 0
_samples: list[tuple[float, float, bool]] = []  # (monotonic end time, latency ms, ok)
_window: dict[str, float] = {}


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
