"""Locust users for tritonforge: Triton over HTTP and gRPC, plus the FastAPI baseline.

Run through ``python -m tritonforge.loadtest.run`` / ``python -m tritonforge.loadtest.bench``, or directly::

    locust -f loadtest/locustfile.py --headless -u 4 -r 4 -t 30s --host http://127.0.0.1:8000 \
        --grpc-url 127.0.0.1:8001 TritonHttpUser TritonGrpcUser

Every user sends ``--texts-per-request`` texts from the deterministic corpus
(:mod:`loadtest.corpus`) per request with no think time (closed loop: concurrency = users), and
validates each answer (shape [n, 384], finite, unit L2 norm); a bad answer is a failure. gRPC goes
through ``tritonclient.grpc`` and is reported into Locust's statistics with ``events.request``.

SLO gates (options, or the environment variables in brackets) are checked when Locust quits; any
breach sets exit code 1 and is named in the log: ``--slo-p95-ms`` [TRITONFORGE_SLO_P95_MS],
``--slo-p99-ms`` [TRITONFORGE_SLO_P99_MS], ``--slo-min-rps`` [TRITONFORGE_SLO_MIN_RPS],
``--slo-max-fail-ratio`` [TRITONFORGE_SLO_MAX_FAIL_RATIO]. ``--samples-out FILE`` writes exact
per-request latencies after ``--warmup-s`` (what the benchmark reads).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from locust import FastHttpUser, User, constant, task

from tritonforge.client.settings import INPUT_NAME, OUTPUT_NAME, route
from tritonforge.loadtest.locust_common import grpc_target, next_texts
from tritonforge.loadtest.slo import ValidationError, validate


def _triton_body(texts: list[str], parameters: dict[str, str]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [
            {"name": INPUT_NAME, "shape": [len(texts), 1], "datatype": "BYTES", "data": texts}
        ],
        "outputs": [{"name": OUTPUT_NAME, "parameters": {"binary_data": False}}],
    }
    if parameters:
        body["parameters"] = parameters
    return body


def _triton_output(payload: dict[str, Any]) -> np.ndarray:
    for output in payload.get("outputs", []):
        if output.get("name") == OUTPUT_NAME:
            return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])
    raise ValidationError(f"no {OUTPUT_NAME!r} output in the response")


class TritonHttpUser(FastHttpUser):
    """POSTs KServe-v2 JSON to ``/v2/models/<model>/infer``."""

    wait_time = constant(0)

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.n = options.texts_per_request
        self.model, self.parameters = route(options.pipeline, options.variant)
        suffix = f"[{options.variant}]" if self.parameters else ""
        self.name = f"http {self.model}{suffix}"
        self.path = f"/v2/models/{self.model}/infer"

    @task
    def embed(self) -> None:
        texts = next_texts(self.n)
        with self.client.post(
            self.path,
            json=_triton_body(texts, self.parameters),
            name=self.name,
            catch_response=True,
        ) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {(response.text or '')[:200]}")
                return
            try:
                validate(_triton_output(response.json()), len(texts))
            except (ValidationError, ValueError, KeyError) as e:
                response.failure(f"invalid response: {e}")


class TritonGrpcUser(User):
    """Calls ``ModelInfer`` through tritonclient.grpc; results go to ``events.request``."""

    wait_time = constant(0)

    def on_start(self) -> None:
        import tritonclient.grpc as grpcclient

        options = self.environment.parsed_options
        self.grpcclient = grpcclient
        self.n = options.texts_per_request
        self.model, self.parameters = route(options.pipeline, options.variant)
        suffix = f"[{options.variant}]" if self.parameters else ""
        self.name = f"grpc {self.model}{suffix}"
        self.triton = grpcclient.InferenceServerClient(
            grpc_target(options.grpc_url, self.environment.host)
        )
        self.outputs = [grpcclient.InferRequestedOutput(OUTPUT_NAME)]

    def on_stop(self) -> None:
        self.triton.close()

    @task
    def embed(self) -> None:
        texts = next_texts(self.n)
        data = np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_)
        infer_input = self.grpcclient.InferInput(INPUT_NAME, list(data.shape), "BYTES")
        infer_input.set_data_from_numpy(data)
        kwargs = {"parameters": self.parameters} if self.parameters else {}
        start = time.perf_counter()
        exception: BaseException | None = None
        length = 0
        try:
            result = self.triton.infer(self.model, [infer_input], outputs=self.outputs, **kwargs)
            array = result.as_numpy(OUTPUT_NAME)
            length = int(array.nbytes)
            validate(array, len(texts))
        except Exception as e:
            exception = e
        self.environment.events.request.fire(
            request_type="grpc",
            name=self.name,
            response_time=(time.perf_counter() - start) * 1000.0,
            response_length=length,
            exception=exception,
            context={},
        )
