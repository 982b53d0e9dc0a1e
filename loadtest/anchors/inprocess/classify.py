"""The in-process limit of a classifier: tokenize (as its served tokenizer model does, padding to
the longest text) -> ONNX Runtime (the fp32 encoder's logits) -> softmax, in one process: no
server, no IPC, no serialization. Timed by :func:`loadtest.anchors.inprocess.embed.measure`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tritonforge.classify import softmax
from tritonforge.loadtest.anchors.inprocess.embed import InProcessEmbedder


class InProcessClassifier(InProcessEmbedder):
    """``embed(texts)`` (the name :func:`loadtest.anchors.inprocess.embed.measure` calls) returns the class
    probabilities ``[n, classes]``; session, tokenizer and padding counts are the embedder's."""

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return softmax(self.run(texts))
