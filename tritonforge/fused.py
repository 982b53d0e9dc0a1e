"""The fused first step: text -> tokens -> the encoder's graph (-> a classifier's postprocess) in
one Python model, so an ensemble makes one step where it made two or three (tokenizer ->
encoder -> postprocess): one stub hop and every tensor hand-off between them fewer
(docs/performance.md, "The fused first step").

What it runs is read, never restated: the plan is the BLS's (:func:`tritonforge.bls.build_plan`
on the fused model's own parameters: the tokenizer model's file and settings, the encoder's input
mapping and output, a classifier's labels), and the graph is the encoder model's (its latest
version's file, its ``config.pbtxt`` session options, pad values and ``batch_rows``). Requests are
batched exactly as the encoder batches what the tokenizer hands it: one call per bucketed shape,
each cut to its longest row (or row by row for dynamic int8, :mod:`tritonforge.batching`), so the
answers are the ensemble's. Only numpy and tokenizers here; the stage builds the session.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tritonforge.batching import AxisNames, infer_rows, infer_trimmed
from tritonforge.bls import BlsPlan, EncoderTarget, latest_version_dir
from tritonforge.bls_calls import plan_encoder_calls, split_encoder_output
from tritonforge.classify import classify
from tritonforge.errors import ModelConfigError
from tritonforge.modelconfig import ModelConfig
from tritonforge.repository import load_model_config
from tritonforge.text import TextTokenizer, split_tokens
from tritonforge.triton import pad_values_from

FUSED_BACKEND = "onnxruntime"
"""The encoder backend a fused model can stand in for (it runs the same ONNX Runtime graph)."""

ENCODER_DIGEST_KEY = "encoder_sha256"
"""The fused model's parameter: the sha256 of the encoder graph it was generated for."""

RunFn = Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]]


@dataclass(frozen=True)
class EncoderGraph:
    """The encoder model a fused model runs in its own process: its config and graph file."""

    target: EncoderTarget
    config: ModelConfig
    path: Path


def encoder_graph(plan: BlsPlan, repository: Path) -> EncoderGraph:
    """The graph of the plan's (default) variant: its encoder's latest version's file.

    :class:`ModelConfigError` when that encoder is not served by ONNX Runtime."""
    target = plan.encoders[plan.default_variant]
    config = load_model_config(repository, target.model)
    backend = str(config.raw.get("backend", ""))
    if backend != FUSED_BACKEND:
        raise ModelConfigError(
            f"{target.model!r} is served by {backend or 'no'} backend; a fused model runs only "
            f"{FUSED_BACKEND} graphs (export the pipeline with fused=False for this variant)"
        )
    filename = config.default_model_filename or "model.onnx"
    return EncoderGraph(
        target, config, latest_version_dir(Path(repository) / target.model) / filename
    )


def check_digest(config: ModelConfig, graph: EncoderGraph, digest: str | None) -> None:
    """Refuse a fused model generated for another graph than the encoder's file (``digest``:
    its verified sha256): a re-export regenerates both (:class:`ModelConfigError` otherwise)."""
    want = config.param(ENCODER_DIGEST_KEY, "", str)
    if want and digest != want:
        raise ModelConfigError(
            f"{config.name!r} was generated for another graph of {graph.target.model!r} "
            f"(sha256 {want[:16]}…, the file is {str(digest)[:16]}…); re-run `make export`"
        )


@dataclass(frozen=True)
class Member:
    """One request's share of an execute: its index, texts and top-k (classifiers)."""

    index: int
    texts: Sequence[str]
    top_k: int = 0


class FusedRunner:
    """Tokenize, run the encoder graph per shape, split back, postprocess.

    ``run``: the graph at one batch (feed -> outputs by name), ``axis_names``: the graph's named
    axes per tensor (batch axis included), ``rows_alone``: run each row by itself (dynamic int8).
    """

    def __init__(
        self,
        plan: BlsPlan,
        graph: EncoderGraph,
        tokenizer: TextTokenizer,
        run: RunFn,
        axis_names: AxisNames,
        rows_alone: bool,
    ) -> None:
        self.plan = plan
        self.target = graph.target
        self.tokenizer = tokenizer
        self._run = run
        self.axis_names = axis_names
        self.pad_values = pad_values_from(graph.config)
        self.rows_alone = rows_alone

    def _infer(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        infer = infer_rows if self.rows_alone else infer_trimmed
        return np.asarray(
            infer(feed, self._run, self.pad_values, self.axis_names)[self.target.output]
        )

    def outputs(self, rows: np.ndarray, top_k: int) -> dict[str, np.ndarray]:
        """The public outputs of ``rows`` of encoder output (the BLS's, without its marks)."""
        post = self.plan.postprocess
        return {self.plan.output: rows} if post is None else classify(rows, post.labels, top_k)

    def answer(
        self, members: Sequence[Member]
    ) -> Iterator[tuple[int, dict[str, np.ndarray] | Exception]]:
        """``(request index, outputs or the error of its encoder call)`` for every member, one
        encoder call per bucketed shape (a failing call fails only its own members)."""
        if not members:
            return
        texts = [t for m in members for t in m.texts]
        parts = split_tokens(
            self.tokenizer.encode(texts),
            [len(m.texts) for m in members],
            pad_to_multiple_of=self.tokenizer.pad_to_multiple_of,
        )
        top_k = {m.index: m.top_k for m in members}
        indexed = [(m.index, part) for m, part in zip(members, parts, strict=True)]
        for batch in plan_encoder_calls(indexed, self.target):
            try:
                output = self._infer(batch.inputs)
                answers = [
                    (i, self.outputs(rows, top_k[i]))
                    for i, rows in split_encoder_output(output, batch, self.target)
                ]
            except Exception as e:  # one failing call must not take the others down
                yield from ((m.request_index, e) for m in batch.members)
                continue
            yield from answers
