"""The third seed's alternative, as users typically write it: FastAPI + uvicorn (one worker) +
transformers ``generate`` with a ``TextIteratorStreamer``, one generate thread per request (no
batching), streaming server-sent events.

``python -m tritonforge.loadtest.anchors.fastapi.generate --port 8090`` serves
``POST /v2/models/generate/generate_stream {"text_input": ..., "parameters": {"max_tokens": N}}``
with the same event format as Triton's generate extension (so one client measures both), and
``GET /health``.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, HTTPException
from fastapi.responses import StreamingResponse

from tritonforge import tasks
from tritonforge.env import env_int
from tritonforge.export.specs.smollm2 import smollm2_spec
from tritonforge.generation import FINISH_REASON, TEXT_INPUT, TEXT_OUTPUT
from tritonforge.logs import run_main
from tritonforge.scheduler import FINISH_LENGTH


def create_app() -> FastAPI:
    spec = smollm2_spec()
    generation = tasks.default(tasks.GENERATOR).module("loadtest")  # the export's loader
    model, tokenizer = generation.load_checkpoint(spec)
    limit = spec.serving.max_new_tokens_limit
    app = FastAPI(title="SmolLM2 streaming (FastAPI + transformers baseline)")

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v2/models/{model_name}/generate_stream")
    def generate_stream(model_name: str, body: dict[str, Any]) -> StreamingResponse:
        from transformers import TextIteratorStreamer

        params = body.get("parameters") or {}
        max_tokens = int(params.get("max_tokens", spec.serving.default_max_new_tokens))
        if not 1 <= max_tokens <= limit or not isinstance(body.get(TEXT_INPUT), str):
            raise HTTPException(400, f"text_input (string) and max_tokens in [1, {limit}]")
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": body[TEXT_INPUT]}],
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )
        streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)

        def run() -> None:
            with torch.inference_mode():
                model.generate(**ids, max_new_tokens=max_tokens, do_sample=False, streamer=streamer)

        threading.Thread(target=run, daemon=True).start()

        def events() -> Iterator[str]:
            for text in streamer:
                if text:
                    yield f"data: {json.dumps({TEXT_OUTPUT: text})}\n\n"
            yield f"data: {json.dumps({TEXT_OUTPUT: '', FINISH_REASON: FINISH_LENGTH})}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tritonforge.loadtest.anchors.fastapi.generate")
    parser.add_argument("--host", default=os.environ.get("TRITONFORGE_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=env_int("FASTAPI_PORT", 8090))
    args = parser.parse_args(argv)
    uvicorn.run(create_app(), host=args.host, port=args.port, workers=1, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
