"""The one reading of a served model's ONNX Runtime knobs (backend, benches, reload timeline)."""

from __future__ import annotations

import onnxruntime as ort
import pytest

from tritonforge.ort_options import session_options

PARAMETERS = {
    "intra_op_thread_count": "2",
    "inter_op_thread_count": "1",
    "session.intra_op.allow_spinning": "0",
    "batch_rows": "auto",
}


def test_threads_and_session_entries_come_from_the_parameters() -> None:
    options = session_options(ort, PARAMETERS)
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (2, 1)
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_without_session_entries_onnx_runtime_keeps_its_defaults() -> None:
    options = session_options(ort, PARAMETERS, session_entries=False)
    assert options.intra_op_num_threads == 2
    with pytest.raises(RuntimeError, match="does not have configuration"):
        options.get_session_config_entry("session.intra_op.allow_spinning")


def test_missing_thread_counts_are_onnx_runtimes_default() -> None:
    options = session_options(ort, {})
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (0, 0)
