"""Locust users for classification pipelines: Triton over HTTP and gRPC, plus the FastAPI
``/predict`` baseline (:mod:`loadtest.anchors.fastapi.classify`).

Same corpus, closed loop, SLO gates (``--slo-*``, checked at quit) and sample output as
:mod:`tritonforge.tasks.embedding.loadtest.locustfile`. The pipeline is discovered (``--pipeline-name``, default: the default
classification pipeline; ``--pipeline`` ensemble|bls, ``--variant``); every answer is validated
against its discovered labels: probabilities [n, classes], finite, each row a distribution, and
``label`` the most probable known label.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tritonforge.loadtest.locust import base
from tritonforge.loadtest.slo import validate_classification
from tritonforge.tasks import classification

TASK = classification.NAME
OUTPUTS = ["label", "probabilities"]  # what the users validate (every classifier has them)


def _labels(values: Any) -> list[str]:
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in np.ravel(values)]


class ClassifyTask(base.TritonTask):
    """Ask for ``label`` and ``probabilities``; valid against the discovered labels."""

    pipeline_task = TASK

    def outputs(self) -> list[str]:
        return OUTPUTS

    def validate(self, fetch: base.Fetch, rows: int) -> None:
        probabilities = fetch("probabilities")
        labels = _labels(fetch("label", object))
        validate_classification(probabilities, labels, rows, self.pipeline.labels)


class TritonClassifyHttpUser(ClassifyTask, base.TritonHttpUser):
    """POSTs KServe-v2 JSON to the classifier's ``/v2/models/<model>/infer``."""


class TritonClassifyGrpcUser(ClassifyTask, base.TritonGrpcUser):
    """Calls the classifier's ``ModelInfer`` through tritonclient.grpc (``events.request``)."""


class FastApiPredictUser(base.FastApiAnchorUser):
    """The first seed's baseline: POST ``{"texts": [...]}`` to ``--predict-path``; answers are
    ``{"predictions": [label, ...], "probabilities": [[...], ...], "labels": [...]}``."""

    name = "http fastapi predict"
    path_option = "predict_path"

    def setup(self) -> None:
        super().setup()
        self.known = [x for x in self.environment.parsed_options.labels.split(",") if x]

    def check(self, answer: Any, rows: int) -> None:
        validate_classification(
            np.asarray(answer["probabilities"], dtype=np.float32),
            [str(x) for x in answer["predictions"]],
            rows,
            self.known or answer["labels"],
        )
