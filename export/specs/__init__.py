"""The one registry of export specs: name -> :class:`Entry` (its task and a factory of its spec).

Every served pipeline is declared here, the decoder (``generation``: a :class:`DecoderSpec`,
exported by :mod:`tasks.generation.export.steps`) beside the encoder pipelines (``embedding``,
``classification``: a :class:`PipelineSpec`, exported by :mod:`export.encoder`); both run the one
flow of :mod:`export.flow`. Adding a default model = adding an entry here; any other Hugging Face
encoder checkpoint needs no entry (``--from-pretrained DIR``). An entry's ``default_args`` make it
one of the default exports (``tritonforge export`` with no spec, ``make export``, and the
background exports of ``serve``/``demo``), with those options.

This module stays light (no torch): the spec types are imported when a spec is built, so the
server can read the registry without paying for the exporter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from tritonforge import tasks
from tritonforge.export.errors import SpecError
from tritonforge.tasks import classification, embedding, generation, image, rerank

if TYPE_CHECKING:
    from tritonforge.export.pipeline_spec import PipelineSpec
    from tritonforge.export.spec import ExportSpec
    from tritonforge.tasks.generation.export.spec import DecoderSpec
    from tritonforge.tasks.image.spec import ImageSpec
    from tritonforge.tasks.rerank.spec import RerankSpec

AnySpec = Union["PipelineSpec", "DecoderSpec", "RerankSpec", "ImageSpec"]
PipelineFactory = Callable[[], "PipelineSpec"]


@dataclass(frozen=True)
class Entry:
    """A registered spec: its task (known without building it) and its factory (``entry()``)."""

    task: str
    factory: Callable[[], AnySpec]
    default_args: tuple[str, ...] | None = None
    """The options of its default export; None: not exported by default."""

    def __call__(self) -> AnySpec:
        return self.factory()


def _minilm() -> PipelineSpec:
    from tritonforge.export.specs.minilm import minilm_pipeline

    return minilm_pipeline()


def _sentiment() -> PipelineSpec:
    from tritonforge.export.specs.sentiment import sentiment_pipeline

    return sentiment_pipeline()


def _smollm2() -> DecoderSpec:
    from tritonforge.export.specs.smollm2 import smollm2_spec

    return smollm2_spec()


def _msmarco() -> RerankSpec:
    from tritonforge.tasks.rerank.spec import MS_MARCO_MINILM

    return MS_MARCO_MINILM


def _efficientnet_lite0() -> ImageSpec:
    from tritonforge.tasks.image.spec import EFFICIENTNET_LITE0

    return EFFICIENTNET_LITE0


# Registry order is the default exports' order, so the fastest first (`make run` serves each one
# as it is done, docs/operations.md): minilm ~1 min, msmarco seconds, smollm2 ~2.5 min, sentiment
# last (it trains the classifier first when its inputs changed, tasks.classification.export.training).
REGISTRY: dict[str, Entry] = {
    "minilm": Entry(embedding.NAME, _minilm, ("--format", "all", "--quantize", "int8")),
    # served as `rerank` / `rerank_bls`; a task of its own kind exports itself (its export.run)
    "msmarco": Entry(rerank.NAME, _msmarco, ()),
    # served as `efficientnet_lite0` (ensemble) / `_bls`; exports itself (tasks/image/export/run)
    "efficientnet_lite0": Entry(image.NAME, _efficientnet_lite0, ()),
    "smollm2": Entry(generation.NAME, _smollm2, ("--quantize", "int8")),
    # last: it trains the classifier first (~170 s on 2 cores) in its own turn; trained beside the
    # exports before it (nice 19), it slowed them more than it gained (docs/operations.md,
    # "Time to every pipeline")
    "sentiment": Entry(classification.NAME, _sentiment, ()),
}


def default_exports() -> tuple[tuple[str, ...], ...]:
    """``(name, *options)`` of every default export, in registry order (the order they run)."""
    return tuple(
        (name, *entry.default_args)
        for name, entry in REGISTRY.items()
        if entry.default_args is not None
    )


def pipeline_names() -> list[str]:
    """The registered encoder pipelines (every entry but the decoders), sorted."""
    return sorted(n for n, e in REGISTRY.items() if tasks.get(e.task).kind == tasks.PIPELINE)


def decoder_names() -> list[str]:
    """The registered decoders, sorted."""
    return sorted(n for n, e in REGISTRY.items() if tasks.get(e.task).kind == tasks.GENERATOR)


def get_entry(name: str) -> Entry:
    try:
        return REGISTRY[name]
    except KeyError as e:
        raise SpecError(f"unknown export spec {name!r}; known: {sorted(REGISTRY)}") from e


def get_pipeline(name: str) -> PipelineSpec:
    """The encoder pipeline ``name``."""
    from tritonforge.export.pipeline_spec import PipelineSpec

    spec = get_entry(name)()
    if not isinstance(spec, PipelineSpec):
        raise SpecError(f"export spec {name!r} is a decoder; pipelines: {pipeline_names()}")
    return spec


def get_decoder(name: str) -> DecoderSpec:
    """The decoder ``name``."""
    from tritonforge.tasks.generation.export.spec import DecoderSpec

    spec = get_entry(name)()
    if not isinstance(spec, DecoderSpec):
        raise SpecError(f"export spec {name!r} is not a decoder; decoders: {decoder_names()}")
    return spec


def get_spec(name: str) -> ExportSpec:
    """The encoder export spec of pipeline ``name``."""
    return get_pipeline(name).encoder
