"""Registry of pipeline specs: name -> factory. Adding a default model = adding an entry here;
any other Hugging Face checkpoint needs no entry (``--from-pretrained DIR``)."""

from __future__ import annotations

from collections.abc import Callable

from tritonforge.export.decoder.spec import DecoderSpec
from tritonforge.export.errors import SpecError
from tritonforge.export.pipeline_spec import PipelineSpec
from tritonforge.export.spec import ExportSpec

PipelineFactory = Callable[[], PipelineSpec]


def _minilm() -> PipelineSpec:
    from tritonforge.export.specs.minilm import minilm_pipeline

    return minilm_pipeline()


def _sentiment() -> PipelineSpec:
    from tritonforge.export.specs.sentiment import sentiment_pipeline

    return sentiment_pipeline()


REGISTRY: dict[str, PipelineFactory] = {"minilm": _minilm, "sentiment": _sentiment}


def _smollm2() -> DecoderSpec:
    from tritonforge.export.specs.smollm2 import smollm2_spec

    return smollm2_spec()


# Causal LMs (KV-cache decoders, exported by export.decoder.steps).
DECODERS: dict[str, Callable[[], DecoderSpec]] = {"smollm2": _smollm2}


def get_pipeline(name: str) -> PipelineSpec:
    try:
        factory = REGISTRY[name]
    except KeyError as e:
        known = sorted([*REGISTRY, *DECODERS])
        raise SpecError(f"unknown export spec {name!r}; known: {known}") from e
    return factory()


def get_spec(name: str) -> ExportSpec:
    """The encoder export spec of pipeline ``name``."""
    return get_pipeline(name).encoder
