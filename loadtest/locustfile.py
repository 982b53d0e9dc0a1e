"""Locust users for tritonforge: Triton over HTTP and gRPC, plus the FastAPI baseline.

Run through ``python -m tritonforge.loadtest.run`` / ``python -m tritonforge.loadtest.bench``, or directly::

    locust -f loadtest/locustfile.py --headless -u 4 -r 4 -t 30s --host http://127.0.0.1:8000 \
        --grpc-url 127.0.0.1:8001 TritonHttpUser TritonGrpcUser

``OpenAIEmbeddingsUser`` loads the same ensemble through the OpenAI-compatible
``/v1/embeddings`` (docs/openai.md; the key from ``$TRITONFORGE_OPENAI_API_KEY`` when set).

Every user sends ``--texts-per-request`` texts from the deterministic corpus
(:mod:`loadtest.corpus`) per request with no think time (closed loop: concurrency = users), and
validates each answer (shape [n, dim], dim discovered from the pipeline's config, finite, unit L2
norm); a bad answer is a failure. Model names come from discovery (``--pipeline-name``, ``--pipeline``,
``--variant``; :mod:`client.discovery`). gRPC goes
through ``tritonclient.grpc`` and is reported into Locust's statistics with ``events.request``.

SLO gates (options, or the environment variables in brackets) are checked when Locust quits; any
breach sets exit code 1 and is named in the log: ``--slo-p95-ms`` [TRITONFORGE_SLO_P95_MS],
``--slo-p99-ms`` [TRITONFORGE_SLO_P99_MS], ``--slo-min-rps`` [TRITONFORGE_SLO_MIN_RPS],
``--slo-max-fail-ratio`` [TRITONFORGE_SLO_MAX_FAIL_RATIO]. ``--samples-out FILE`` writes exact
per-request latencies after ``--warmup-s`` (what the benchmark reads).
"""

from __future__ import annotations

import os
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
from tritonforge.loadtest.slo import ValidationError, validate
from tritonforge.pipelines import Pipeline


def triton_body(
    pipeline: Pipeline, texts: list[str], outputs: list[str], parameters: dict[str, Any]
) -> dict[str, Any]:
    """KServe-v2 JSON: the pipeline's text input, ``outputs`` as JSON, request ``parameters``."""
    body: dict[str, Any] = {
        "inputs": [
            {"name": pipeline.input, "shape": [len(texts), 1], "datatype": "BYTES", "data": texts}
        ],
        "outputs": [{"name": n, "parameters": {"binary_data": False}} for n in outputs],
    }
    if parameters:
        body["parameters"] = parameters
    return body


def triton_output(payload: dict[str, Any], name: str, dtype: Any = np.float32) -> np.ndarray:
    for output in payload.get("outputs", []):
        if output.get("name") == name:
            return np.asarray(output["data"], dtype=dtype).reshape(output["shape"])
    raise ValidationError(f"no {name!r} output in the response")


def grpc_text_input(grpcclient: Any, pipeline: Pipeline, texts: list[str]) -> Any:
    data = np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_)
    infer_input = grpcclient.InferInput(pipeline.input, list(data.shape), "BYTES")
    infer_input.set_data_from_numpy(data)
    return infer_input


class TritonHttpUser(FastHttpUser):
    """POSTs KServe-v2 JSON to ``/v2/models/<model>/infer``."""

    wait_time = constant(0)

    def __init__(self, environment: Any) -> None:
        bounded_network_timeout(self, environment)
        super().__init__(environment)

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.n = options.texts_per_request
        self.pipeline, self.model, self.parameters, suffix = target(self.environment, "embedding")
        self.output = self.pipeline.outputs[0].name
        self.name = f"http {self.model}{suffix}"
        self.path = f"/v2/models/{self.model}/infer"

    @task
    def embed(self) -> None:
        texts = next_texts(self.n)
        with self.client.post(
            self.path,
            json=triton_body(self.pipeline, texts, [self.output], self.parameters),
            name=self.name,
            catch_response=True,
        ) as response:
            check_json(
                response,
                lambda payload: validate(
                    triton_output(payload, self.output), len(texts), self.pipeline.dim
                ),
            )


class TritonGrpcUser(User):
    """Calls ``ModelInfer`` through tritonclient.grpc; results go to ``events.request``."""

    wait_time = constant(0)

    def on_start(self) -> None:
        import tritonclient.grpc as grpcclient

        options = self.environment.parsed_options
        self.grpcclient = grpcclient
        self.n = options.texts_per_request
        self.pipeline, self.model, self.parameters, suffix = target(self.environment, "embedding")
        self.output = self.pipeline.outputs[0].name
        self.name = f"grpc {self.model}{suffix}"
        self.triton = grpcclient.InferenceServerClient(
            grpc_target(options.grpc_url, self.environment.host)
        )
        self.outputs = [grpcclient.InferRequestedOutput(self.output)]
        self.timeout_s = options.request_timeout_s

    def on_stop(self) -> None:
        self.triton.close()

    @task
    def embed(self) -> None:
        texts = next_texts(self.n)
        infer_input = grpc_text_input(self.grpcclient, self.pipeline, texts)
        kwargs = {"parameters": self.parameters} if self.parameters else {}
        start = time.perf_counter()
        exception: BaseException | None = None
        length = 0
        try:
            result = self.triton.infer(
                self.model,
                [infer_input],
                outputs=self.outputs,
                client_timeout=self.timeout_s,
                **kwargs,
            )
            array = result.as_numpy(self.output)
            length = int(array.nbytes)
            validate(array, len(texts), self.pipeline.dim)
        except Exception as e:
            exception = e
        fire_grpc(self.environment, self.name, start, length, exception)


class OpenAIEmbeddingsUser(FastHttpUser):
    """POSTs OpenAI's embeddings request to ``/v1/embeddings`` (the ensemble of ``--variant``;
    the BLS has no /v1 model), validated like the v2 answers."""

    wait_time = constant(0)

    def __init__(self, environment: Any) -> None:
        bounded_network_timeout(self, environment)
        super().__init__(environment)

    def on_start(self) -> None:
        from tritonforge.runtime.openai_api import embedding_model_id

        options = self.environment.parsed_options
        self.n = options.texts_per_request
        self.pipeline, self.model, _, _ = target(self.environment, "embedding")
        variant = next((v for v, m in self.pipeline.ensembles.items() if m == self.model), None)
        if variant is None:
            raise ValidationError(f"{self.model!r} is not an ensemble: /v1 serves ensembles only")
        self.model_id = embedding_model_id(self.pipeline.name, variant)
        self.name = f"/v1/embeddings {self.model_id}"
        key = os.environ.get("TRITONFORGE_OPENAI_API_KEY") or "none"
        self.headers = {"Authorization": f"Bearer {key}"}

    @task
    def embed(self) -> None:
        texts = next_texts(self.n)
        body = {"model": self.model_id, "input": texts, "encoding_format": "float"}
        with self.client.post(
            "/v1/embeddings", json=body, headers=self.headers, name=self.name, catch_response=True
        ) as response:
            check_json(
                response,
                lambda payload: validate(
                    np.asarray([d["embedding"] for d in payload["data"]], np.float32),
                    len(texts),
                    self.pipeline.dim,
                ),
            )
