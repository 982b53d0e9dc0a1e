"""The in-process limit of a classifier: tokenize (as its served tokenizer model does, padding to
the longest text) -> ONNX Runtime (the fp32 encoder's logits) -> softmax, in one process: no
server, no IPC, no serialization. Timed by :func:`loadtest.inprocess.measure`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from tritonforge.classify import softmax
from tritonforge.text import TextTokenizer


class InProcessClassifier:
    """``embed(texts)`` (the name :func:`loadtest.inprocess.measure` calls) returns the class
    probabilities ``[n, classes]``; padding is counted like the embedder's."""

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

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        feed = self.tokenizer.encode(list(texts))
        mask = feed["attention_mask"]
        self.total_tokens += mask.size
        self.padded_tokens += int(mask.size - mask.sum())
        (logits,) = self.session.run(None, {k: v for k, v in feed.items() if k in self.input_names})
        return softmax(logits)
