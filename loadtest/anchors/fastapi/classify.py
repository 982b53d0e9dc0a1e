"""The first seed's service, as users typically write it: FastAPI + uvicorn (one worker) + a
Hugging Face sequence classifier in PyTorch eager (``transformers``), built from the same
checkpoint directory as the served classifier; tokenize, run and softmax in the request handler.

``python -m tritonforge.loadtest.anchors.fastapi.classify --checkpoint DIR --port 8081`` serves
``POST /predict {"texts": [...]}`` (1 to 32 texts, else 422) -> ``{"predictions": [label, ...],
"probabilities": [[...], ...], "labels": [...]}`` and ``GET /health``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

MAX_TEXTS = 32  # the first seed's limit


class PredictRequest(BaseModel):
    texts: list[str]


def create_app(checkpoint: Path, max_length: int) -> FastAPI:
    """The service; loads the tokenizer and the eager model once (labels from ``id2label``)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    model = AutoModelForSequenceClassification.from_pretrained(str(checkpoint)).eval()
    id2label = model.config.id2label
    labels = [str(id2label[i]) for i in range(len(id2label))]
    app = FastAPI(title=f"{checkpoint.name} classifier (FastAPI + PyTorch eager baseline)")

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "labels": labels}

    @app.post("/predict")
    def predict(request: PredictRequest) -> dict[str, Any]:
        if not request.texts or len(request.texts) > MAX_TEXTS:
            raise HTTPException(422, f"texts: send 1 to {MAX_TEXTS} texts")
        batch = tokenizer(
            request.texts,
            padding=True,
            truncation=True,
            max_length=max_length,
            return_tensors="pt",
        )
        with torch.inference_mode():
            probabilities = torch.softmax(model(**batch).logits, dim=-1)
        return {
            "predictions": [labels[i] for i in probabilities.argmax(dim=-1).tolist()],
            "probabilities": probabilities.tolist(),
            "labels": labels,
        }

    return app


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tritonforge.loadtest.anchors.fastapi.classify", description=__doc__
    )
    parser.add_argument("--checkpoint", type=Path, required=True, help="Hugging Face directory")
    parser.add_argument("--max-length", type=int, required=True, help="the served tokenizer's")
    parser.add_argument("--host", default=os.environ.get("TRITONFORGE_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("FASTAPI_PORT", "8081")))
    args = parser.parse_args(argv)
    app = create_app(args.checkpoint, args.max_length)
    uvicorn.run(app, host=args.host, port=args.port, workers=1, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
