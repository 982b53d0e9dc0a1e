"""Locust users for classification pipelines: Triton over HTTP and gRPC, plus the FastAPI
``/predict`` baseline (:mod:`loadtest.classify_fastapi_app`).

Same corpus, closed loop, SLO gates (``--slo-*``, checked at quit) and sample output as
:mod:`loadtest.locustfile`. The pipeline is discovered (``--pipeline-name``, default: the default
classification pipeline; ``--pipeline`` ensemble|bls, ``--variant``); every answer is validated
against its discovered labels: probabilities [n, classes], finite, each row a distribution, and
``label`` the most probable known label.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from locust import FastHttpUser, User, constant, task

from tritonforge.loadtest.locust_common import (
    bounded_network_timeout,
    check_json,
    fire_grpc,
    grpc_target,
    next_texts,
    target,
)
from tritonforge.loadtest.locustfile import grpc_text_input, triton_body, triton_output
from tritonforge.loadtest.slo import validate_classification

TASK = "classification"
OUTPUTS = ["label", "probabilities"]  # what the users validate (every classifier has them)


def _labels(values: Any) -> list[str]:
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in np.ravel(values)]


class TritonClassifyHttpUser(FastHttpUser):
    """POSTs KServe-v2 JSON to the classifier's ``/v2/models/<model>/infer``."""

    wait_time = constant(0)

    def __init__(self, environment: Any) -> None:
        bounded_network_timeout(self, environment)
        super().__init__(environment)

    def on_start(self) -> None:
        self.n = self.environment.parsed_options.texts_per_request
        self.pipeline, self.model, self.parameters, suffix = target(self.environment, TASK)
        self.name = f"http {self.model}{suffix}"
        self.path = f"/v2/models/{self.model}/infer"

    @task
    def classify(self) -> None:
        texts = next_texts(self.n)
        body = triton_body(self.pipeline, texts, OUTPUTS, self.parameters)
        with self.client.post(self.path, json=body, name=self.name, catch_response=True) as r:
            check_json(
                r,
                lambda payload: validate_classification(
                    triton_output(payload, "probabilities"),
                    _labels(triton_output(payload, "label", dtype=object)),
                    len(texts),
                    self.pipeline.labels,
                ),
            )


class TritonClassifyGrpcUser(User):
    """Calls the classifier's ``ModelInfer`` through tritonclient.grpc (``events.request``)."""

    wait_time = constant(0)

    def on_start(self) -> None:
        import tritonclient.grpc as grpcclient

        options = self.environment.parsed_options
        self.grpcclient = grpcclient
        self.n = options.texts_per_request
        self.pipeline, self.model, self.parameters, suffix = target(self.environment, TASK)
        self.name = f"grpc {self.model}{suffix}"
        self.triton = grpcclient.InferenceServerClient(
            grpc_target(options.grpc_url, self.environment.host)
        )
        self.outputs = [grpcclient.InferRequestedOutput(n) for n in OUTPUTS]
        self.timeout_s = options.request_timeout_s

    def on_stop(self) -> None:
        self.triton.close()

    @task
    def classify(self) -> None:
        texts = next_texts(self.n)
        kwargs = {"parameters": self.parameters} if self.parameters else {}
        start = time.perf_counter()
        exception: BaseException | None = None
        length = 0
        try:
            result = self.triton.infer(
                self.model,
                [grpc_text_input(self.grpcclient, self.pipeline, texts)],
                outputs=self.outputs,
                client_timeout=self.timeout_s,
                **kwargs,
            )
            probabilities = result.as_numpy("probabilities")
            length = int(probabilities.nbytes)
            validate_classification(
                probabilities, _labels(result.as_numpy("label")), len(texts), self.pipeline.labels
            )
        except Exception as e:
            exception = e
        fire_grpc(self.environment, self.name, start, length, exception)


class FastApiPredictUser(FastHttpUser):
    """The first seed's baseline: POST ``{"texts": [...]}`` to ``--predict-path``; answers are
    ``{"predictions": [label, ...], "probabilities": [[...], ...], "labels": [...]}``."""

    wait_time = constant(0)

    def __init__(self, environment: Any) -> None:
        bounded_network_timeout(self, environment)
        super().__init__(environment)

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.n = options.texts_per_request
        self.path = options.predict_path
        self.known = [x for x in options.labels.split(",") if x]

    @task
    def predict(self) -> None:
        texts = next_texts(self.n)
        with self.client.post(
            self.path, json={"texts": texts}, name="http fastapi predict", catch_response=True
        ) as r:
            check_json(
                r,
                lambda payload: validate_classification(
                    np.asarray(payload["probabilities"], dtype=np.float32),
                    [str(x) for x in payload["predictions"]],
                    len(texts),
                    self.known or payload["labels"],
                ),
            )
