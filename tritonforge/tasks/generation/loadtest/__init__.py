"""The generation task's benches (loadtest layer): the structured-output benches, the decoder's
int8 experiments (:mod:`.decoder_experiments`) and the loaders the shared anchors reach through
the registry (``tasks.get(...).module("loadtest")``): the FastAPI baseline's model
(:func:`load_checkpoint`) and llama.cpp's source checkpoint (:func:`save_checkpoint`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tritonforge.tasks.generation.export.spec import DecoderSpec


def load_checkpoint(spec: DecoderSpec) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of ``spec``'s pinned GGUF (PyTorch, dequantized; the export's
    loader). Imports torch and transformers."""
    from tritonforge.tasks.generation.export.load import load_gguf, package_file

    return load_gguf(package_file(spec.package, spec.checkpoint))


def save_checkpoint(spec: DecoderSpec, out: Path) -> Path:
    """``spec``'s checkpoint as a Hugging Face directory at ``out`` (written atomically by the
    export's :func:`~tritonforge.tasks.generation.export.genai.save_hf_checkpoint`)."""
    from tritonforge.tasks.generation.export.genai import save_hf_checkpoint

    model, tokenizer = load_checkpoint(spec)
    return save_hf_checkpoint(model, tokenizer, out)
