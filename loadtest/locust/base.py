"""One Locust base user per protocol; a task's locustfile subclasses them and fills the hooks.

- :class:`JsonHttpUser`: POST a JSON body per request (any HTTP API: the FastAPI anchors,
  OpenAI's ``/v1``); hooks :meth:`~JsonHttpUser.setup` (path, name), :meth:`~JsonHttpUser.payload`
  (texts -> body) and :meth:`~JsonHttpUser.check` (answer JSON -> raise on a bad answer);
- :class:`FastApiAnchorUser`: the FastAPI anchors' ``{"texts": [...]}`` requests;
- :class:`TritonHttpUser` / :class:`TritonGrpcUser`: a discovered pipeline's model over KServe-v2
  JSON / ``tritonclient.grpc``; the task gives :attr:`TritonTask.pipeline_task` (what discovery looks
  for), :meth:`TritonTask.outputs` and one :meth:`TritonTask.validate` for both protocols (it
  reads the answer through ``fetch(name, dtype)``, whatever the protocol).

Every user sends ``--texts-per-request`` corpus texts per request with no think time (closed
loop); a bad answer is a failure. The bases are abstract: Locust never runs them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

import numpy as np
from locust import FastHttpUser, User, constant, task

from tritonforge import tasks
from tritonforge.loadtest.locust.common import (
    bounded_network_timeout,
    check_json,
    fire_grpc,
    grpc_target,
    next_texts,
    target,
)
from tritonforge.loadtest.slo import ValidationError
from tritonforge.pipelines import Pipeline


class Fetch(Protocol):
    """An answer's output ``name`` as an array (``dtype`` for JSON answers; gRPC keeps its own)."""

    def __call__(self, name: str, dtype: Any = np.float32) -> np.ndarray: ...


def triton_body(
    pipeline: Pipeline,
    texts: list[str],
    outputs: list[str],
    parameters: dict[str, Any],
    binary: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """KServe-v2 JSON: the pipeline's text input, ``outputs`` as JSON (those in ``binary`` as
    binary data), request ``parameters``."""
    body: dict[str, Any] = {
        "inputs": [
            {"name": pipeline.input, "shape": [len(texts), 1], "datatype": "BYTES", "data": texts}
        ],
        "outputs": [{"name": n, "parameters": {"binary_data": n in binary}} for n in outputs],
    }
    if parameters:
        body["parameters"] = parameters
    return body


def triton_output(payload: dict[str, Any], name: str, dtype: Any = np.float32) -> np.ndarray:
    """Output ``name`` of a KServe-v2 JSON answer; :class:`ValidationError` when it is absent."""
    for output in payload.get("outputs", []):
        if output.get("name") == name:
            return np.asarray(output["data"], dtype=dtype).reshape(output["shape"])
    raise ValidationError(f"no {name!r} output in the response")


def grpc_text_input(grpcclient: Any, pipeline: Pipeline, texts: list[str]) -> Any:
    """The pipeline's BYTES text input [n, 1] for ``tritonclient.grpc``."""
    data = np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_)
    infer_input = grpcclient.InferInput(pipeline.input, list(data.shape), "BYTES")
    infer_input.set_data_from_numpy(data)
    return infer_input


class JsonHttpUser(FastHttpUser):
    """POSTs :meth:`payload` to :attr:`path`; :meth:`check` judges the JSON answer."""

    abstract = True
    wait_time = constant(0)
    path: str = "/"
    name: str = ""
    headers: dict[str, str] | None = None

    def __init__(self, environment: Any) -> None:
        bounded_network_timeout(self, environment)
        super().__init__(environment)

    def on_start(self) -> None:
        self.n = self.environment.parsed_options.texts_per_request
        self.setup()

    def setup(self) -> None:
        """Hook: set :attr:`path` and :attr:`name` (and :attr:`headers`) from the options."""

    def payload(self, texts: list[str]) -> dict[str, Any]:
        """Hook: the request body for ``texts``."""
        return {"texts": texts}

    def check(self, answer: Any, rows: int) -> None:
        """Hook: raise :class:`ValidationError` (or ``KeyError``/``ValueError``) on a bad answer
        to ``rows`` texts."""
        raise NotImplementedError

    @task
    def request(self) -> None:
        texts = next_texts(self.n)
        with self.client.post(
            self.path,
            json=self.payload(texts),
            headers=self.headers,
            name=self.name,
            catch_response=True,
        ) as response:
            check_json(response, lambda answer: self.check(answer, len(texts)))


class FastApiAnchorUser(JsonHttpUser):
    """A FastAPI anchor service: POST ``{"texts": [...]}`` to the path in option
    :attr:`path_option`; the task gives :attr:`name` and :meth:`check`."""

    abstract = True
    path_option: ClassVar[str] = "embed_path"

    def setup(self) -> None:
        self.path = getattr(self.environment.parsed_options, self.path_option)


class TritonTask:
    """The task hooks of a Triton user, shared by its HTTP and gRPC users."""

    pipeline_task: ClassVar[str] = tasks.default().name  # a task's users override it
    pipeline: Pipeline

    def outputs(self) -> list[str]:
        """Hook: the outputs to ask for (the pipeline is discovered by then)."""
        raise NotImplementedError

    def validate(self, fetch: Fetch, rows: int) -> None:
        """Hook: raise :class:`ValidationError` unless the answer to ``rows`` texts is right; the
        first output fetched sizes the answer in Locust's statistics."""
        raise NotImplementedError


class TritonHttpUser(TritonTask, JsonHttpUser):
    """POSTs KServe-v2 JSON to the discovered model's ``/v2/models/<model>/infer``."""

    abstract = True

    def setup(self) -> None:
        self.pipeline, self.model, self.parameters, suffix = target(
            self.environment, self.pipeline_task
        )
        self.name = f"http {self.model}{suffix}"
        self.path = f"/v2/models/{self.model}/infer"

    def payload(self, texts: list[str]) -> dict[str, Any]:
        return triton_body(self.pipeline, texts, self.outputs(), self.parameters)

    def check(self, answer: Any, rows: int) -> None:
        def fetch(name: str, dtype: Any = np.float32) -> np.ndarray:
            return triton_output(answer, name, dtype)

        self.validate(fetch, rows)


class TritonGrpcUser(TritonTask, User):
    """Calls the discovered model's ``ModelInfer`` through tritonclient.grpc; each call goes to
    Locust's statistics through ``events.request``."""

    abstract = True
    wait_time = constant(0)

    def on_start(self) -> None:
        import tritonclient.grpc as grpcclient

        options = self.environment.parsed_options
        self.grpcclient = grpcclient
        self.n = options.texts_per_request
        self.pipeline, self.model, self.parameters, suffix = target(
            self.environment, self.pipeline_task
        )
        self.name = f"grpc {self.model}{suffix}"
        self.triton = grpcclient.InferenceServerClient(
            grpc_target(options.grpc_url, self.environment.host)
        )
        self.requested = [grpcclient.InferRequestedOutput(n) for n in self.outputs()]
        self.timeout_s = options.request_timeout_s

    def on_stop(self) -> None:
        self.triton.close()

    @task
    def request(self) -> None:
        texts = next_texts(self.n)
        infer_input = grpc_text_input(self.grpcclient, self.pipeline, texts)
        kwargs = {"parameters": self.parameters} if self.parameters else {}
        sizes: list[int] = []
        start = time.perf_counter()
        exception: BaseException | None = None
        try:
            result = self.triton.infer(
                self.model,
                [infer_input],
                outputs=self.requested,
                client_timeout=self.timeout_s,
                **kwargs,
            )
            self.validate(_sized(result.as_numpy, sizes), len(texts))
        except Exception as e:
            exception = e
        fire_grpc(self.environment, self.name, start, sizes[0] if sizes else 0, exception)


def _sized(as_numpy: Callable[[str], Any], sizes: list[int]) -> Fetch:
    """``as_numpy`` as a :class:`Fetch` that appends each array's byte size to ``sizes``."""

    def fetch(name: str, dtype: Any = np.float32) -> np.ndarray:
        array = as_numpy(name)
        if array is None:
            raise ValidationError(f"no {name!r} output in the response")
        sizes.append(int(array.nbytes))
        return array

    return fetch
