"""Locust users for image classification: the sample photos, one per request, through the typed
client's ``.classify_image`` (HTTP on ``--host``, gRPC on ``--grpc-url``), each answer validated
(top-k labels distinct, scores finite, in [0, 1], best first, probabilities summing to 1) and
timed as one Locust request.

    locust -f tritonforge/tasks/image/loadtest/locustfile.py --host http://127.0.0.1:8000 \\
        --grpc-url 127.0.0.1:8001 ImageHttpUser ImageGrpcUser
"""

from __future__ import annotations

import itertools
import math
import os
import time
from typing import Any

from locust import User, events, task

from tritonforge.client.settings import normalize_url
from tritonforge.client.sync import EmbeddingClient
from tritonforge.loadtest.locust import gevent_glue  # noqa: F401  (registers: gevent, gRPC, run time)
from tritonforge.tasks.image.samples import sample_photos


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    parser.add_argument("--grpc-url", default="", help="host:port of gRPC (ImageGrpcUser)")
    parser.add_argument("--image-route", default="ensemble", help="ensemble | bls")


def check(answer: Any) -> None:
    """Distinct top labels, finite scores in [0, 1] best first, probabilities summing to 1."""
    scores = [r.score for r in answer.top]
    assert len({r.label for r in answer.top}) == len(scores), "repeated labels"
    assert all(math.isfinite(s) and 0.0 <= s <= 1.0 for s in scores), scores
    assert scores == sorted(scores, reverse=True), "not best first"
    assert abs(float(answer.probabilities.sum()) - 1.0) < 1e-3, "probabilities do not sum to 1"


class ImageUser(User):
    abstract = True
    protocol = "http"

    def on_start(self) -> None:
        options = self.environment.parsed_options
        url = options.grpc_url if self.protocol == "grpc" else normalize_url(self.host or "")
        self.route = options.image_route
        self.client = EmbeddingClient(
            url, self.protocol, admin_key=os.environ.get("TRITONFORGE_ADMIN_KEY")
        )
        self.photos = itertools.cycle([p.read_bytes() for p in sample_photos().values()])
        self.client.classify_image(next(self.photos), route=self.route)  # discovery, once

    def on_stop(self) -> None:
        self.client.close()

    @task
    def classify_image(self) -> None:
        image = next(self.photos)
        start, error = time.perf_counter(), None
        try:
            (answer,) = self.client.classify_image(image, route=self.route)
            check(answer)
        except Exception as e:  # a failed request, reported to Locust
            error = e
        self.environment.events.request.fire(
            request_type=self.protocol,
            name=f"{self.protocol} classify_image {self.route}",
            response_time=(time.perf_counter() - start) * 1000,
            response_length=len(image),
            exception=error,
            context={},
        )


class ImageHttpUser(ImageUser):
    protocol = "http"


class ImageGrpcUser(ImageUser):
    protocol = "grpc"
