"""Locust user for the FastAPI + PyTorch baseline (:mod:`loadtest.fastapi_app`).

Same corpus, validation, SLO gates and sample output as :mod:`loadtest.locustfile`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from locust import FastHttpUser, constant, task

from tritonforge.loadtest.locust_common import bounded_network_timeout, check_json, next_texts
from tritonforge.loadtest.slo import validate


class FastApiUser(FastHttpUser):
    """The baseline: POST ``{"texts": [...]}`` to the FastAPI service's ``--embed-path``."""

    wait_time = constant(0)

    def __init__(self, environment: Any) -> None:
        bounded_network_timeout(self, environment)
        super().__init__(environment)

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.n = options.texts_per_request
        self.path = options.embed_path
        self.dim = options.dim

    @task
    def embed(self) -> None:
        texts = next_texts(self.n)
        with self.client.post(
            self.path, json={"texts": texts}, name="http fastapi", catch_response=True
        ) as response:
            check_json(response, lambda payload: self._check(payload, len(texts)))

    def _check(self, payload: Any, rows: int) -> None:
        array = np.asarray(payload["embeddings"], dtype=np.float32)
        if not self.dim and array.ndim == 2:
            self.dim = array.shape[1]  # no --dim: later answers must match the first
        validate(array, rows, self.dim)
