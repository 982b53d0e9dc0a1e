"""The load tools' view of the served pipelines: discovered from the repository's configs (the
``tritonforge.*`` parameters), never named here. A stage is found by its role and variant."""

from __future__ import annotations

import contextlib
from pathlib import Path

from tritonforge.errors import ModelConfigError
from tritonforge.pipelines import ROLE_KEY, VARIANT_KEY, Pipeline, from_repository
from tritonforge.repository import load_model_config
from tritonforge.text import TextTokenizer, served_tokenizer


def pipelines(repository: Path) -> dict[str, Pipeline]:
    """Every pipeline the repository declares, by name."""
    return from_repository(Path(repository))


def stage_model(
    repository: Path, pipeline: Pipeline, role: str, variant: str | None = None
) -> str | None:
    """The pipeline's model with ``role`` (and ``variant``), or None when it has none."""
    for name in pipeline.models:
        with contextlib.suppress(ModelConfigError):
            config = load_model_config(Path(repository), name)
            if config.parameters.get(ROLE_KEY) != role:
                continue
            if variant is None or config.parameters.get(VARIANT_KEY) == variant:
                return name
    return None


def encoder_onnx(repository: Path, pipeline: Pipeline, variant: str) -> Path | None:
    """The ONNX file of the pipeline's ``variant`` encoder (None: not an exported ONNX one)."""
    model = stage_model(repository, pipeline, "encoder", variant)
    path = Path(repository) / model / "1" / "model.onnx" if model else None
    return path if path is not None and path.is_file() else None


def text_tokenizer(repository: Path, pipeline: Pipeline) -> TextTokenizer:
    """The pipeline's tokenization as its tokenizer model does it (file, ``max_length``,
    ``pad_id``, output names from its config), padding to the longest text of a batch."""
    model = stage_model(repository, pipeline, "tokenizer")
    path = tokenizer_file(repository, pipeline)
    if model is None or path is None:
        raise ModelConfigError(f"pipeline {pipeline.name!r} has no tokenizer model in {repository}")
    return served_tokenizer(Path(repository) / model, version=path.parent.name)


def tokenizer_file(repository: Path, pipeline: Pipeline) -> Path | None:
    """The served tokenizer.json of the pipeline (its tokenizer model's, latest version)."""
    model = stage_model(repository, pipeline, "tokenizer")
    if model is None:
        return None
    config = load_model_config(Path(repository), model)
    name = config.param("tokenizer_file", kind=str)
    versions = sorted(
        (p for p in (Path(repository) / model).iterdir() if p.name.isdigit()),
        key=lambda p: int(p.name),
    )
    return versions[-1] / name if versions else None
