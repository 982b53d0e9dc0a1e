"""The classification half of ``make bench``: every discovered classification pipeline against
the first seed's FastAPI + PyTorch ``/predict`` service (:mod:`loadtest.anchors.fastapi.classify`)
and its in-process limit (:mod:`loadtest.anchors.inprocess.classify`), in the same run, loaded by the
same generator (Locust over HTTP, :mod:`.locustfile`) as the embedding cells. The shared bench
(``loadtest.bench``) reaches this module through the registry (the package's ``BENCH``).

The baseline runs the Hugging Face checkpoint the pipeline was exported from: ``--classify-
checkpoint DIR``, else the directory of the registry spec of that name (``export.specs``), and it
is verified against the fp32 encoder's export report (the sha256 of each checkpoint file the
export read), so both sides serve the same weights.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tritonforge.integrity import sha256_file
from tritonforge.loadtest.discovered import encoder_onnx, stage_model, text_tokenizer
from tritonforge.pipelines import Pipeline
from tritonforge.repository import load_model_config
from tritonforge.tasks import classification

TASK = classification.NAME
FASTAPI_MODULE = "tritonforge.loadtest.anchors.fastapi.classify"
FASTAPI_LABEL = "fastapi+torch /predict"  # the baseline's cells, followed by the pipeline


@dataclass(frozen=True)
class Baseline:
    """What the FastAPI service of one pipeline runs: its checkpoint and tokenizer length."""

    pipeline: Pipeline
    checkpoint: Path
    max_length: int

    def service_args(self) -> list[str]:
        return ["--checkpoint", str(self.checkpoint), "--max-length", str(self.max_length)]


def registry_checkpoint(name: str) -> Path | None:
    """The checkpoint directory of the registry spec named ``name`` (its tokenizer's folder)."""
    from tritonforge.export.specs import get_pipeline, pipeline_names

    for registered in pipeline_names():
        with contextlib.suppress(Exception):  # a spec that cannot be built here is not ours
            spec = get_pipeline(registered)
            if spec.name == name:
                return Path(spec.tokenizer_file).parent
    return None


def report_sources(repository: Path, pipeline: Pipeline) -> dict[str, str]:
    """File name -> sha256 of the checkpoint files the fp32 encoder was exported from."""
    model = stage_model(repository, pipeline, "encoder", "fp32")
    if model is None:
        return {}
    for report in sorted((Path(repository) / model).glob("*/export_report.json")):
        with contextlib.suppress(OSError, ValueError, KeyError):
            return dict(json.loads(report.read_text())["fingerprint"]["sources"])
    return {}


def checkpoint_mismatches(directory: Path, sources: dict[str, str]) -> list[str]:
    """Files of ``directory`` whose sha256 differs from the export report's (or are missing)."""
    if not sources:
        return ["the export report lists no source files"]
    out = []
    for name, digest in sorted(sources.items()):
        path = directory / name
        if not path.is_file():
            out.append(f"{name} is missing")
        elif sha256_file(path) != digest:
            out.append(f"{name} differs from the exported one")
    return out


def baseline_for(
    repository: Path, pipeline: Pipeline, given: Path | None
) -> tuple[Baseline | None, str]:
    """The verified baseline of ``pipeline``, or None and why not."""
    directory = given or registry_checkpoint(pipeline.name)
    if directory is None:
        return None, "no checkpoint (pass --classify-checkpoint DIR)"
    problems = checkpoint_mismatches(directory, report_sources(repository, pipeline))
    if problems:
        return None, f"{directory} is not the exported checkpoint: {'; '.join(problems)}"
    tokenizer = stage_model(repository, pipeline, "tokenizer")
    assert tokenizer is not None  # a discovered pipeline has one
    max_length = load_model_config(repository, tokenizer).param("max_length", kind=int)
    return Baseline(pipeline, directory, max_length), ""


def load_classifiers(repository: Path, pipeline: Pipeline, variants: Sequence[str]) -> dict:
    """One in-process classifier per variant whose encoder is an exported ONNX file."""
    from tritonforge.loadtest.anchors.inprocess.classify import InProcessClassifier

    tokenizer = text_tokenizer(repository, pipeline)
    out: dict[str, Any] = {}
    for variant in variants:
        onnx = encoder_onnx(repository, pipeline, variant)
        if onnx is not None:
            out[variant] = InProcessClassifier(onnx, tokenizer)
    return out


def ratio_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Served vs FastAPI and vs the in-process limit, per classification cell (reported)."""
    lines = []
    for r in rows:
        if r.get("task") != TASK or r["system"] != "triton":
            continue
        line = (
            f"{r['label']} @{r['concurrency']}: {r['x_inprocess_throughput']:.2f}x the in-process "
        )
        line += "batch-1 limit"
        if not math.isnan(r["x_fastapi_throughput"]):  # FastAPI is measured by Locust only
            line += (
                f", {r['x_fastapi_throughput']:.2f}x FastAPI /predict's throughput, "
                f"p99 {r['x_fastapi_p99']:.2f}x FastAPI's"
            )
        lines.append(line)
    return lines
