"""Offline graph optimisation with ONNX Runtime's transformer optimizer (fusions)."""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path

from tritonforge.export.errors import ExportError
from tritonforge.export.spec import GraphOptimization


def optimize_graph(src: Path, dst: Path, settings: GraphOptimization) -> dict[str, int]:
    """Fuse attention / LayerNorm / GELU offline; returns the fused op counts."""
    from onnxruntime.transformers import optimizer

    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            model = optimizer.optimize_model(
                str(src),
                model_type=settings.model_type,
                num_heads=settings.num_heads,
                hidden_size=settings.hidden_size,
                opt_level=0,
                use_gpu=False,
            )
            fused = {k: int(v) for k, v in model.get_fused_operator_statistics().items() if v}
            model.save_model_to_file(str(dst))
    except Exception as e:
        raise ExportError(
            f"ONNX Runtime transformer optimizer failed on {src.name}: {type(e).__name__}: {e}; "
            "set optimization=None in the spec to skip it"
        ) from e
    return fused
