"""The in-process limit: tokenize + ONNX Runtime (pooling in the graph) + L2-normalise in one
process, no server, no IPC, no serialization. Naive batching: each batch is padded to its longest
text, exactly what a user's own loop would do.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from tritonforge.loadtest.slo import AsDict
from tritonforge.text import TextTokenizer, served_tokenizer


@dataclass(frozen=True)
class InProcessResult(AsDict):
    variant: str
    batch: int
    calls: int
    sentences: int
    seconds: float
    sentences_per_s: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    padded_token_share: float
    """Share of the tokens fed to the model that are padding."""


def repository_tokenizer(model_repository: Path) -> TextTokenizer:
    """The served tokenizer model's tokenizer (same ids as the server), padding to the longest."""
    return served_tokenizer(model_repository / "tokenizer")


class InProcessEmbedder:
    """tokenize -> ONNX Runtime session -> normalise; the model's graph returns pooled vectors."""

    def __init__(self, onnx_path: Path, tokenizer: TextTokenizer, threads: int = 0) -> None:
        self.tokenizer = tokenizer
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(
            str(onnx_path), options, providers=["CPUExecutionProvider"]
        )
        self.input_names = {i.name for i in self.session.get_inputs()}
        self.padded_tokens = 0
        self.total_tokens = 0

    def run(self, texts: Sequence[str]) -> np.ndarray:
        """Tokenize, count padding, run the graph; its one output."""
        feed = self.tokenizer.encode(list(texts))
        self.total_tokens += feed["attention_mask"].size
        self.padded_tokens += int(feed["attention_mask"].size - feed["attention_mask"].sum())
        (out,) = self.session.run(None, {k: v for k, v in feed.items() if k in self.input_names})
        return np.asarray(out)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        pooled = self.run(texts)
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


def measure(
    embedder: InProcessEmbedder,
    texts: Sequence[str],
    *,
    variant: str,
    batch: int,
    duration_s: float,
    warmup_calls: int = 3,
) -> InProcessResult:
    """Loop over ``texts`` in batches of ``batch`` for about ``duration_s`` seconds."""
    cursor = 0

    def next_batch() -> list[str]:
        nonlocal cursor
        out = [texts[(cursor + i) % len(texts)] for i in range(batch)]
        cursor = (cursor + batch) % len(texts)
        return out

    for _ in range(warmup_calls):
        embedder.embed(next_batch())
    embedder.padded_tokens = embedder.total_tokens = 0
    latencies: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < duration_s:
        items = next_batch()
        t0 = time.perf_counter()
        embedder.embed(items)
        latencies.append((time.perf_counter() - t0) * 1000.0)
    seconds = time.perf_counter() - start
    p50, p95, p99 = (float(x) for x in np.percentile(latencies, [50, 95, 99]))
    return InProcessResult(
        variant=variant,
        batch=batch,
        calls=len(latencies),
        sentences=len(latencies) * batch,
        seconds=seconds,
        sentences_per_s=len(latencies) * batch / seconds,
        p50_ms=p50,
        p95_ms=p95,
        p99_ms=p99,
        padded_token_share=embedder.padded_tokens / max(1, embedder.total_tokens),
    )
