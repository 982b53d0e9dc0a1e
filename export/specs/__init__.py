"""Registry of export specs: name -> factory. Adding a model = adding an entry here."""

from __future__ import annotations

from collections.abc import Callable

from tritonforge.export.decoder.spec import DecoderSpec
from tritonforge.export.errors import SpecError
from tritonforge.export.spec import ExportSpec

SpecFactory = Callable[[], ExportSpec]


def _minilm() -> ExportSpec:
    from tritonforge.export.specs.minilm import minilm_spec

    return minilm_spec()


REGISTRY: dict[str, SpecFactory] = {"minilm": _minilm}


def _smollm2() -> DecoderSpec:
    from tritonforge.export.specs.smollm2 import smollm2_spec

    return smollm2_spec()


# Causal LMs (KV-cache decoders, exported by export.decoder.pipeline).
DECODERS: dict[str, Callable[[], DecoderSpec]] = {"smollm2": _smollm2}


def get_spec(name: str) -> ExportSpec:
    try:
        factory = REGISTRY[name]
    except KeyError as e:
        known = sorted([*REGISTRY, *DECODERS])
        raise SpecError(f"unknown export spec {name!r}; known: {known}") from e
    return factory()
