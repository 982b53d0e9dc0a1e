"""An exported KV-cache decoder (ONNX) run with ONNX Runtime: the step function of
:class:`tritonforge.scheduler.Scheduler`. Names and shapes are read from the graph, never
restated: past inputs are ``past_key_values.<i>.key|value`` and presents ``present.<i>.*``."""

from __future__ import annotations

import operator
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tritonforge.errors import ModelConfigError
from tritonforge.kv_batch import LEFT, RIGHT

INPUT_IDS, ATTENTION_MASK, POSITION_IDS, LOGITS = (
    "input_ids",
    "attention_mask",
    "position_ids",
    "logits",
)
PAST_PREFIX, PRESENT_PREFIX = "past_key_values.", "present."
# Spinning intra-op threads take the cores from the scheduler thread, the stub and Triton between
# steps: served int8 measured 2.8 -> 8.9 tok/s at 1 stream, 5.6 -> 13.9 at 8 with it off
# (docs/performance.md). A ``session.intra_op.allow_spinning`` config parameter overrides it.
SESSION_DEFAULTS = {"session.intra_op.allow_spinning": "0"}
# Columns a right-padded running batch's cache grows by when full, so that decode steps write
# their new column in place (OrtDecoder.in_place); 64 steps per regrowth copy.
IN_PLACE_HEADROOM = 64


def past_names(layers: int) -> list[str]:
    return [f"{PAST_PREFIX}{i}.{kind}" for i in range(layers) for kind in ("key", "value")]


def present_names(layers: int) -> list[str]:
    return [f"{PRESENT_PREFIX}{i}.{kind}" for i in range(layers) for kind in ("key", "value")]


class OrtDecoder:
    """``step(ids, mask, positions, past) -> (logits, presents)`` over an ONNX decoder.

    :attr:`layout` (read from the graph) says how a batch's rows lie in the cache:
    :data:`~tritonforge.kv_batch.LEFT` when ``position_ids`` is an input (the torch.onnx export),
    else :data:`~tritonforge.kv_batch.RIGHT`: every row's tokens start at column 0, the mask's
    row sums give each row's length, from which the graph derives positions (ONNX Runtime's
    ``GroupQueryAttention``, the GenAI builder's graphs); ``positions`` is not fed then."""

    def __init__(
        self,
        path: Path,
        intra_op_threads: int = 1,
        session_config: Mapping[str, str] | None = None,
        digest: str | None = None,
    ) -> None:
        """``session_config``: ONNX Runtime session config entries (``session.*`` keys), passed
        as they are over :data:`SESSION_DEFAULTS`. ``digest``: ``path``'s verified sha256; with
        it the optimised graph is remembered for the next load (:mod:`tritonforge.ort_graphs`)."""
        import onnxruntime as ort

        from tritonforge import ort_graphs

        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        entries = {**SESSION_DEFAULTS, **(session_config or {})}
        for key, value in entries.items():
            options.add_session_config_entry(key, value)
        self.session = ort_graphs.session(ort, path, digest, options, entries)
        inputs = {i.name: i for i in self.session.get_inputs()}
        self.layers = sum(1 for n in inputs if n.startswith(PAST_PREFIX)) // 2
        self.past = past_names(self.layers)
        self.layout = LEFT if POSITION_IDS in inputs else RIGHT
        missing = [n for n in (INPUT_IDS, ATTENTION_MASK, *self.past) if n not in inputs]
        if missing or not self.layers:
            raise ModelConfigError(f"{path}: not a KV-cache decoder; missing inputs {missing}")
        shape = inputs[self.past[0]].shape  # [batch, kv_heads, past, head_dim]
        if not isinstance(shape[1], int) or not isinstance(shape[3], int):
            raise ModelConfigError(
                f"{path}: {self.past[0]} has shape {shape}; its heads and head axes must be "
                "concrete (re-export the decoder)"
            )
        self.kv_heads, self.head_dim = shape[1], shape[3]
        self.outputs = [LOGITS, *present_names(self.layers)]
        self.vocab_size = int(self.session.get_outputs()[0].shape[-1])
        # what a running batch's cache should keep free for in-place steps (kv_batch.new_batch)
        self.kv_headroom = IN_PLACE_HEADROOM if self.layout == RIGHT else 0
        self._bound: tuple[tuple[np.ndarray, ...], Any] | None = None  # (pasts, IO binding)

    def empty_past(self, batch: int = 1) -> list[np.ndarray]:
        shape = (batch, self.kv_heads, 0, self.head_dim)
        return [np.zeros(shape, np.float32) for _ in self.past]

    def __call__(
        self, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray, past: list[np.ndarray]
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """One step. A right-padded graph's decode step whose ``past`` buffers have room for the
        new columns (as wide as ``mask``: :attr:`in_place`; several new tokens at batch 1 only,
        a speculative step) writes them into them in place and returns them as the presents (ONNX Runtime GenAI's
        ``past_present_share_buffer``: GroupQueryAttention shares a past and its present when
        they are one buffer, so the cache is not copied every step; measured bit-identical to
        the copying path, docs/performance.md)."""
        if self.in_place(ids, mask, past):
            return self._in_place(ids, mask, past)
        feed = {INPUT_IDS: ids, ATTENTION_MASK: mask}
        if self.layout == LEFT:
            feed[POSITION_IDS] = positions
        feed.update(zip(self.past, past, strict=True))
        logits, *presents = self.session.run(self.outputs, feed)
        return logits, presents

    def in_place(self, ids: np.ndarray, mask: np.ndarray, past: list[np.ndarray]) -> bool:
        """Whether this step writes into ``past`` (see :meth:`__call__`)."""
        return (
            self.layout == RIGHT
            and (ids.shape[1] == 1 or ids.shape[0] == 1)  # several new tokens: batch 1 only
            and past[0].shape[2] >= mask.shape[1]
            and all(p.flags.c_contiguous and p.dtype == np.float32 for p in past)
        )

    def _in_place(
        self, ids: np.ndarray, mask: np.ndarray, past: list[np.ndarray]
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        io = self._binding(past)
        io.bind_cpu_input(INPUT_IDS, np.ascontiguousarray(ids))
        io.bind_cpu_input(ATTENTION_MASK, np.ascontiguousarray(mask))
        io.bind_output(LOGITS)
        self.session.run_with_iobinding(io)
        return io.get_outputs()[0].numpy(), past

    def _binding(self, past: list[np.ndarray]) -> Any:
        """An IO binding with each of ``past`` bound as its past and its present: the last one
        while the very same buffers come back (a running batch's row slots, step after step;
        binding 60 tensors anew was ~5% of a served token at one row, py-spy), else a new one."""
        import onnxruntime as ort

        bound = self._bound
        if bound and len(bound[0]) == len(past) and all(map(operator.is_, bound[0], past)):
            return bound[1]
        io = self.session.io_binding()
        io.bind_output(LOGITS)  # first: get_outputs()[0]; bound again (same place) every step
        for name, present, p in zip(self.past, self.outputs[1:], past, strict=True):
            value = ort.OrtValue.ortvalue_from_numpy(p)  # shares p's memory
            io.bind_ortvalue_input(name, value)
            io.bind_ortvalue_output(present, value)
        self._bound = (tuple(past), io)
        return io
