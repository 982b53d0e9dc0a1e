"""ONNX Runtime session options from a served model's config: one reading of its knobs.

``parameters.intra_op_thread_count`` / ``inter_op_thread_count`` (0: ONNX Runtime's default) and
every ``session.*`` parameter passed through as a session config entry (``session.intra_op.
allow_spinning`` = ``0``, ...), as the served ``onnxruntime`` backend builds its session; the
benches and the reload timeline build theirs with the same function so that they measure it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SESSION_PREFIX = "session."


def _int(parameters: Mapping[str, str], key: str) -> int:
    return int(parameters.get(key, 0) or 0)


def session_options(ort: Any, parameters: Mapping[str, str], session_entries: bool = True) -> Any:
    """``ort.SessionOptions`` with the thread counts of ``parameters`` and, unless
    ``session_entries`` is false (ONNX Runtime's defaults, spinning on), its ``session.*``
    entries. ``ort``: the imported ``onnxruntime`` module (the core does not import it)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = _int(parameters, "intra_op_thread_count")
    options.inter_op_num_threads = _int(parameters, "inter_op_thread_count")
    if session_entries:
        for key, value in parameters.items():
            if key.startswith(SESSION_PREFIX):
                options.add_session_config_entry(key, value)
    return options
