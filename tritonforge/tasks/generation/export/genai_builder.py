"""Run ONNX Runtime GenAI's model builder on a checkpoint read by transformers 5:
``python -m tritonforge.tasks.generation.export.genai_builder ARGS`` = the builder's own command line.

The builder (0.18) expects transformers 4's config attributes. transformers 5 nests Gemma 3's
rotary settings per attention type (``rope_parameters = {"full_attention": {...},
"sliding_attention": {...}}``) where the builder reads a flat ``rope_parameters`` with
``rope_type`` plus ``rope_local_base_freq``; :func:`adapt_config` gives it that view of the same
numbers. The builder stamps ``producer_version`` with the git HEAD of the directory its venv
sits in (``0.18.0+<commit>``: one decoder sha256 per checkout and commit, so every commit's
export missed the optimised-graph cache, :mod:`tritonforge.ort_graphs`);
:func:`deterministic_stamp` leaves the package version alone. Everything else is the builder
unchanged (run as ``__main__``).
"""

from __future__ import annotations

import importlib
import runpy
import sys
from typing import Any

BUILDER_MODULE = "onnxruntime_genai.models.builder"


def adapt_config(config: Any) -> Any:
    """``config`` with per-attention-type rotary settings flattened as the builder reads them:
    global layers' as ``rope_parameters``/``rope_theta``, local layers' theta as
    ``rope_local_base_freq``. Other configs are returned unchanged."""
    rope = getattr(config, "rope_parameters", None)
    if not isinstance(rope, dict):
        return config
    full = rope.get("full_attention")
    if isinstance(full, dict):
        local = rope.get("sliding_attention") or full
        config.rope_parameters = dict(full)
        config.rope_theta = full["rope_theta"]
        config.rope_local_base_freq = local["rope_theta"]
    return config


def deterministic_stamp() -> None:
    """The builder's ``producer_version`` is its package version, without the git HEAD of
    wherever the venv lives (the same inputs give the same bytes in every checkout)."""
    importlib.import_module("onnxruntime_genai.models")  # puts the builder's folder on sys.path
    model: Any = importlib.import_module("builders.base").Model
    model.get_genai_commit = classmethod(lambda cls: None)


def main() -> None:
    import transformers

    deterministic_stamp()

    load = transformers.AutoConfig.from_pretrained

    def from_pretrained(*args: Any, **kwargs: Any) -> Any:
        return adapt_config(load(*args, **kwargs))

    transformers.AutoConfig.from_pretrained = from_pretrained  # type: ignore[method-assign]
    sys.argv[0] = BUILDER_MODULE
    runpy.run_module(BUILDER_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
