"""Locust users for embedding pipelines: Triton over HTTP and gRPC, OpenAI's ``/v1/embeddings``,
plus the FastAPI baseline (:mod:`loadtest.anchors.fastapi.embed`): the task hooks on the
base users of :mod:`loadtest.locust.base`.

Run through ``python -m tritonforge.loadtest.locust.run`` / ``python -m tritonforge.loadtest.bench``, or directly::

    locust -f tritonforge/tasks/embedding/loadtest/locustfile.py --headless -u 4 -r 4 -t 30s \
        --host http://127.0.0.1:8000 --grpc-url 127.0.0.1:8001 TritonHttpUser TritonGrpcUser

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
from typing import Any

import numpy as np

from tritonforge.loadtest.locust import base
from tritonforge.loadtest.locust.common import target
from tritonforge.loadtest.slo import ValidationError, validate
from tritonforge.tasks import embedding


class EmbedTask(base.TritonTask):
    """Ask for the pipeline's embedding output; valid: [n, dim] finite rows of unit norm."""

    pipeline_task = embedding.NAME

    def outputs(self) -> list[str]:
        return [self.pipeline.outputs[0].name]

    def validate(self, fetch: base.Fetch, rows: int) -> None:
        validate(fetch(self.outputs()[0]), rows, self.pipeline.dim)


class TritonHttpUser(EmbedTask, base.TritonHttpUser):
    """POSTs KServe-v2 JSON to ``/v2/models/<model>/infer``."""


class TritonGrpcUser(EmbedTask, base.TritonGrpcUser):
    """Calls ``ModelInfer`` through tritonclient.grpc; results go to ``events.request``."""


class OpenAIEmbeddingsUser(base.JsonHttpUser):
    """POSTs OpenAI's embeddings request to ``/v1/embeddings`` (the ensemble of ``--variant``;
    the BLS has no /v1 model), validated like the v2 answers."""

    path = "/v1/embeddings"

    def setup(self) -> None:
        from tritonforge.runtime.front.openai.catalog import embedding_model_id

        self.pipeline, self.model, _, _ = target(self.environment, embedding.NAME)
        variant = next((v for v, m in self.pipeline.ensembles.items() if m == self.model), None)
        if variant is None:
            raise ValidationError(f"{self.model!r} is not an ensemble: /v1 serves ensembles only")
        self.model_id = embedding_model_id(self.pipeline.name, variant)
        self.name = f"/v1/embeddings {self.model_id}"
        key = os.environ.get("TRITONFORGE_OPENAI_API_KEY") or "none"
        self.headers = {"Authorization": f"Bearer {key}"}

    def payload(self, texts: list[str]) -> dict[str, Any]:
        return {"model": self.model_id, "input": texts, "encoding_format": "float"}

    def check(self, answer: Any, rows: int) -> None:
        array = np.asarray([d["embedding"] for d in answer["data"]], np.float32)
        validate(array, rows, self.pipeline.dim)


class FastApiUser(base.FastApiAnchorUser):
    """The baseline: POST ``{"texts": [...]}`` to the FastAPI service's ``--embed-path``."""

    name = "http fastapi"
    path_option = "embed_path"

    def setup(self) -> None:
        super().setup()
        self.dim = self.environment.parsed_options.dim

    def check(self, answer: Any, rows: int) -> None:
        array = np.asarray(answer["embeddings"], dtype=np.float32)
        if not self.dim and array.ndim == 2:
            self.dim = array.shape[1]  # no --dim: later answers must match the first
        validate(array, rows, self.dim)
