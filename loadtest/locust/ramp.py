"""Locust scenario of :mod:`loadtest.reliability.ramp`: a ramp past capacity to the embedding BLS.

Users (one request per second each, so the user count is the offered rate; the shape
:class:`RampShape` ramps them per ``--ramp-*``):

* ``RampHttpUser``: KServe-v2 JSON to the BLS with ``fallback`` = ``--ramp-fallback``; an answer
  is counted by the ``variant`` output that produced it, a 503 as refused. Open loop: each
  request runs in its own greenlet, so a user offers one request a second however slow the
  answers are (a closed loop would offer less as latency grows, and a "3x" peak would not be).
* ``RampClientUser``: the same through :class:`client.sync.EmbeddingClient` (``pipeline="bls"``)
  with its retries and circuit breaker; a :class:`CircuitOpenError` is counted as
  ``breaker_open`` (failed fast, the server saw nothing). Open loop too: each request in its own
  greenlet on its own sibling client, all of a user's requests behind the user's one breaker.
* ``RampSaturationUser``: closed loop (no wait), to measure the saturation rate.

At quit ``--ramp-out`` gets ``{"seconds": [...], "report": {...}}`` (:func:`loadtest.reliability.ramp.report`)
and the exit code is 1 when the answered requests' p99 breaks ``--slo-p99-ms``; refusals are the
measurement here, not a failure of the run.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from gevent.pool import Group
from locust import FastHttpUser, LoadTestShape, User, constant, constant_throughput, events, task
from locust.env import Environment

from tritonforge import tasks
from tritonforge.loadtest.locust import common as locust_common
from tritonforge.loadtest.locust.base import triton_body
from tritonforge.loadtest.locust.common import bounded_network_timeout, discovered, next_texts
from tritonforge.loadtest.reliability.ramp import RampPlan, per_second, report

log = logging.getLogger("tritonforge.loadtest.reliability.ramp")
_samples: list[tuple[float, float, str]] = []
_said: set[str] = set()
_in_flight = Group()  # the open-loop requests, awaited when the run stops
_start: dict[str, float] = {}


@events.init_command_line_parser.add_listener
def _ramp_options(parser: Any) -> None:
    parser.add_argument("--ramp-base-users", type=int, default=1)
    parser.add_argument("--ramp-peak-users", type=int, default=4)
    parser.add_argument("--ramp-s", type=float, default=5.0)
    parser.add_argument("--ramp-peak-s", type=float, default=5.0)
    parser.add_argument("--ramp-fallback", default="none", help="int8 | none")
    parser.add_argument("--ramp-out", default="", help="write the per-second JSON here")


def _plan(environment: Environment) -> RampPlan:
    o: Any = environment.parsed_options
    return RampPlan(o.ramp_base_users, o.ramp_peak_users, o.ramp_s, o.ramp_peak_s)


class RampShape(LoadTestShape):
    """Users per :class:`RampPlan` (spawned at once at each step)."""

    def tick(self) -> tuple[int, float] | None:
        assert self.runner is not None
        users = _plan(self.runner.environment).users_at(self.get_run_time())
        return None if users is None else (users, max(1, users))


def _record(
    environment: Environment, name: str, start: float, outcome: str, fire: bool = False
) -> None:
    """One sample for the per-second rows; ``fire`` also reports it to Locust's statistics
    (the HTTP users' requests are reported by FastHttpUser itself)."""
    now = time.perf_counter()
    _start.setdefault("t0", start)
    _samples.append((now, (now - start) * 1000.0, outcome))
    if not fire:
        return
    failed = outcome not in ("fp32", "int8")
    environment.events.request.fire(
        request_type="ramp",
        name=name,
        response_time=(now - start) * 1000.0,
        response_length=0,
        exception=RuntimeError(outcome) if failed else None,
        context={},
    )


def _say_once(what: str, message: str) -> None:
    """Log each distinct refusal message once (what refused: Triton's queue, the front...)."""
    key = message[:120]
    if key not in _said:
        _said.add(key)
        log.info("%s: %s", what, key)


def _variant(body: bytes, header_length: str | None) -> str:
    """The ``variant`` output of a KServe-v2 answer whose other outputs may be binary."""
    payload = json.loads(body[: int(header_length)] if header_length else body)
    for output in payload.get("outputs", []):
        if output.get("name") == "variant" and output.get("data"):
            return str(output["data"][0])
    return "failed"


class RampHttpUser(FastHttpUser):
    wait_time = constant_throughput(1)
    open_loop = True
    # connections per user: an open-loop user has several requests in flight when answers are
    # slow, and waiting for one of Locust's own connections would count as server latency
    concurrency = 64

    def __init__(self, environment: Any) -> None:
        bounded_network_timeout(self, environment)
        super().__init__(environment)

    def on_start(self) -> None:
        options = self.environment.parsed_options
        pipeline = discovered(self.environment, tasks.default().name)
        assert pipeline.bls is not None, f"pipeline {pipeline.name!r} has no BLS"
        self.path = f"/v2/models/{pipeline.bls}/infer"
        self.pipeline = pipeline
        self.outputs = [pipeline.outputs[0].name, "variant"]
        # the embedding as binary, as tritonclient asks for it (JSON floats would cost the
        # server and this load generator CPU that a real client does not spend)
        self.binary = frozenset(self.outputs[:1])
        self.params = {"fallback": options.ramp_fallback}
        self.n = options.texts_per_request

    @task
    def embed(self) -> None:
        if self.open_loop:
            _in_flight.spawn(self._embed)
        else:
            self._embed()

    def _embed(self) -> None:
        texts = next_texts(self.n)
        body = triton_body(self.pipeline, texts, self.outputs, self.params, self.binary)
        start = time.perf_counter()
        response = self.client.post(self.path, data=json.dumps(body), name="ramp bls")
        if response.status_code == 200:
            headers: Any = response.headers or {}
            length = headers.get("Inference-Header-Content-Length")
            outcome = _variant(response.content or b"{}", str(length) if length else None)
        elif response.status_code == 503:
            outcome = "refused"
            _say_once("refused (503)", response.text or "")
        else:
            outcome = "failed"
        _record(self.environment, "ramp bls", start, outcome)


class RampSaturationUser(RampHttpUser):
    wait_time = constant(0)
    open_loop = False


class RampClientUser(User):
    """Through the project's client: retries with backoff and the circuit breaker.

    Open loop like :class:`RampHttpUser`: each request runs in its own greenlet on a
    :meth:`sibling <client.core.BaseClient.sibling>` of the user's client (a blocking client
    belongs to the greenlet that made it), so every request of a user shares its one breaker,
    as the threads of one application would, and none waits for another's answer."""

    wait_time = constant_throughput(1)

    def on_start(self) -> None:
        from tritonforge.client.sync import EmbeddingClient

        options: Any = self.environment.parsed_options
        host = (self.environment.host or "").removeprefix("http://")
        self.client = EmbeddingClient(
            host,
            "http",
            pipeline="bls",
            timeout_s=options.request_timeout_s,
            deadline_s=options.request_timeout_s,
            repository=options.model_repository or None,
        )
        self.client.pipelines()  # discovered once per user, shared by the siblings
        self.n = options.texts_per_request

    def on_stop(self) -> None:
        self.client.close()

    @task
    def embed(self) -> None:
        _in_flight.spawn(self._embed)

    def _embed(self) -> None:
        from tritonforge.client.errors import CircuitOpenError, ClientError, ServerUnavailableError

        start = time.perf_counter()
        client = self.client.sibling()
        try:
            client.embed(next_texts(self.n))
            outcome = "fp32"  # the client pins nothing: the BLS default
        except CircuitOpenError:
            outcome = "breaker_open"
        except ServerUnavailableError:
            outcome = "refused"
        except ClientError:
            outcome = "failed"
        finally:
            client.close()
        _record(self.environment, "ramp client", start, outcome, fire=True)


@events.test_stop.add_listener
def _await_in_flight(environment: Environment, **kwargs: Any) -> None:
    """Let the open-loop requests still in flight finish (each is bounded by the request
    timeout), so the slowest answers of the peak are counted, not dropped."""
    options: Any = environment.parsed_options
    _in_flight.join(timeout=(options.request_timeout_s if options else 10.0) + 5.0)


@events.quitting.add_listener
def _ramp_quitting(environment: Environment, **kwargs: Any) -> None:
    options: Any = environment.parsed_options
    if options is None:
        return
    result = report(_samples, options.slo_p99_ms)
    if options.ramp_out:
        out = {
            "seconds": per_second(_samples, _start.get("t0", 0.0)),
            "report": result.as_dict(),
            "fallback": options.ramp_fallback,
        }
        Path(options.ramp_out).write_text(json.dumps(out))
    # refusals are what the ramp measures: only the answered requests' p99 gates the run
    environment.process_exit_code = 0 if result.p99_ok else 1


__all__ = ["RampClientUser", "RampHttpUser", "RampSaturationUser", "RampShape", "locust_common"]
