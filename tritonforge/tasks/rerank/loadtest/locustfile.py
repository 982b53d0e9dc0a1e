"""Locust users for reranking: one query's documents per request through the typed client's
``.rerank`` (HTTP on ``--host``, gRPC on ``--grpc-url``), each answer validated (every document
ranked once, scores finite, in [0, 1], best first) and timed as one Locust request.

    locust -f tritonforge/tasks/rerank/loadtest/locustfile.py --host http://127.0.0.1:8000 \\
        --grpc-url 127.0.0.1:8001 RerankHttpUser RerankGrpcUser
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

from locust import User, events, task

from tritonforge.client.settings import normalize_url
from tritonforge.client.sync import EmbeddingClient
from tritonforge.loadtest.locust import gevent_glue  # noqa: F401  (registers: gevent, gRPC, run time)
from tritonforge.tasks.rerank.loadtest import DOCUMENTS, QUERY


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    parser.add_argument("--grpc-url", default="", help="host:port of gRPC (RerankGrpcUser)")
    parser.add_argument("--rerank-route", default="ensemble", help="ensemble | bls")


def check(results: list[Any], count: int) -> None:
    """Every document once, scores finite in [0, 1], best first; AssertionError otherwise."""
    assert sorted(r.index for r in results) == list(range(count)), "documents missing"
    scores = [r.relevance_score for r in results]
    assert all(math.isfinite(s) and 0.0 <= s <= 1.0 for s in scores), scores
    assert scores == sorted(scores, reverse=True), "not best first"


class RerankUser(User):
    abstract = True
    protocol = "http"

    def on_start(self) -> None:
        options = self.environment.parsed_options
        url = options.grpc_url if self.protocol == "grpc" else normalize_url(self.host or "")
        self.route = options.rerank_route
        self.client = EmbeddingClient(
            url, self.protocol, admin_key=os.environ.get("TRITONFORGE_ADMIN_KEY")
        )
        self.client.rerank(QUERY, list(DOCUMENTS[:1]), route=self.route)  # discovery, once

    def on_stop(self) -> None:
        self.client.close()

    @task
    def rerank(self) -> None:
        start, error = time.perf_counter(), None
        try:
            check(self.client.rerank(QUERY, list(DOCUMENTS), route=self.route), len(DOCUMENTS))
        except Exception as e:  # a failed request, reported to Locust
            error = e
        self.environment.events.request.fire(
            request_type=self.protocol,
            name=f"{self.protocol} rerank {self.route}",
            response_time=(time.perf_counter() - start) * 1000,
            response_length=len(DOCUMENTS),
            exception=error,
            context={},
        )


class RerankHttpUser(RerankUser):
    protocol = "http"


class RerankGrpcUser(RerankUser):
    protocol = "grpc"
