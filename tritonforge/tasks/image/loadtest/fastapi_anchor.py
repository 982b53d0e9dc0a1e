"""The service users typically write, for the image bench cell: FastAPI + uvicorn (one worker)
+ the PyTorch eager model, the training script's preprocessing in the handler (PIL ``open`` +
``convert``, torchvision-style Resize / CenterCrop / ToTensor / Normalize:
:func:`tritonforge.tasks.image.reference.reference_pixels`), softmax.

``create_app(build, preprocessing, labels)`` serves ``POST /predict`` (the encoded image as the
body) -> ``{"label", "score", "probabilities"}`` (422 for an unreadable image) and
``GET /health``.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from fastapi import FastAPI, HTTPException, Request
from PIL import Image, UnidentifiedImageError

from tritonforge.classify import softmax
from tritonforge.tasks.image.preprocessing import ImagePreprocessing
from tritonforge.tasks.image.reference import reference_pixels


def create_app(
    build: Callable[[], torch.nn.Module], preprocessing: ImagePreprocessing, labels: Sequence[str]
) -> FastAPI:
    """The service; builds the eager model once (eval mode)."""
    model = build().eval()
    app = FastAPI(title="image classifier (FastAPI + PyTorch eager baseline)")

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok"}

    @app.post("/predict")
    async def predict(request: Request) -> dict[str, Any]:
        body = await request.body()
        try:
            Image.open(io.BytesIO(body)).verify()
        except (UnidentifiedImageError, OSError) as e:
            raise HTTPException(422, f"image: {e}") from e
        pixels = reference_pixels(body, preprocessing)
        with torch.inference_mode():
            logits = model(torch.from_numpy(pixels[None].astype(np.float32))).numpy()
        probabilities = softmax(logits)[0]
        best = int(probabilities.argmax())
        return {
            "label": labels[best],
            "score": float(probabilities[best]),
            "probabilities": probabilities.tolist(),
        }

    return app
