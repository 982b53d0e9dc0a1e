"""Locust user for the FastAPI + PyTorch baseline (:mod:`loadtest.fastapi_app`).

Same corpus, validation, SLO gates and sample output as :mod:`loadtest.locustfile`.
"""

from __future__ import annotations

import numpy as np
from locust import FastHttpUser, constant, task

from tritonforge.loadtest.locust_common import next_texts
from tritonforge.loadtest.slo import ValidationError, validate


class FastApiUser(FastHttpUser):
    """The baseline: POST ``{"texts": [...]}`` to the FastAPI service's ``--embed-path``."""

    wait_time = constant(0)

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.n = options.texts_per_request
        self.path = options.embed_path

    @task
    def embed(self) -> None:
        texts = next_texts(self.n)
        with self.client.post(
            self.path, json={"texts": texts}, name="http fastapi", catch_response=True
        ) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {(response.text or '')[:200]}")
                return
            try:
                validate(np.asarray(response.json()["embeddings"], dtype=np.float32), len(texts))
            except (ValidationError, ValueError, KeyError) as e:
                response.failure(f"invalid response: {e}")
