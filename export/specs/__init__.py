"""Registry of export specs: name -> factory. Adding a model = adding an entry here."""

from __future__ import annotations

from collections.abc import Callable

from tritonforge.export.errors import SpecError
from tritonforge.export.spec import ExportSpec

SpecFactory = Callable[[], ExportSpec]


def _minilm() -> ExportSpec:
    from tritonforge.export.specs.minilm import minilm_spec

    return minilm_spec()


REGISTRY: dict[str, SpecFactory] = {"minilm": _minilm}


def get_spec(name: str) -> ExportSpec:
    try:
        factory = REGISTRY[name]
    except KeyError as e:
        raise SpecError(f"unknown export spec {name!r}; known: {sorted(REGISTRY)}") from e
    return factory()
