"""The decoder's ONNX graph: export with a KV cache (named dynamic axes), its checks, weight-only
int8 and a decode step's latency."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from tritonforge.decoder import OrtDecoder, past_names, present_names
from tritonforge.export.errors import ExportError
from tritonforge.export.onnx_export import torch_to_onnx
from tritonforge.kv_batch import LEFT
from tritonforge.tasks.generation.export.module import KVCacheDecoder
from tritonforge.tasks.generation.export.spec import (
    BATCH_AXIS,
    PAST_AXIS,
    SEQ_AXIS,
    TOTAL_AXIS,
    DecoderSpec,
    WeightOnlyQuantization,
)


def export_graph(decoder: KVCacheDecoder, spec: DecoderSpec, path: Path) -> None:
    """torch.onnx export (TorchScript-based) with named dynamic axes on every tensor."""
    b, p, s = spec.trace_shape
    if min(spec.trace_shape) < 2:
        raise ExportError(f"spec {spec.name}: trace_shape {spec.trace_shape} needs every size >= 2")
    vocab = int(decoder.model.config.vocab_size)
    ids = torch.randint(3, vocab, (b, s))
    past = [
        torch.randn(b, decoder.kv_heads, p, decoder.head_dim) for _ in range(2 * decoder.layers)
    ]
    args = (ids, torch.ones(b, p + s, dtype=torch.long), torch.arange(p, p + s).repeat(b, 1), *past)
    pasts, presents = past_names(decoder.layers), present_names(decoder.layers)
    axes: dict[str, dict[int, str]] = {
        "input_ids": {0: BATCH_AXIS, 1: SEQ_AXIS},
        "attention_mask": {0: BATCH_AXIS, 1: TOTAL_AXIS},
        "position_ids": {0: BATCH_AXIS, 1: SEQ_AXIS},
        "logits": {0: BATCH_AXIS, 1: SEQ_AXIS},
    }
    axes.update({n: {0: BATCH_AXIS, 2: PAST_AXIS} for n in pasts})
    axes.update({n: {0: BATCH_AXIS, 2: TOTAL_AXIS} for n in presents})
    names = (["input_ids", "attention_mask", "position_ids", *pasts], ["logits", *presents])
    torch_to_onnx(decoder, args, path, names, axes, spec.opset, spec.name, no_grad=True)


def check_graph(path: Path, layers: int, layout: str = LEFT, checker: bool = True) -> list[str]:
    """onnx.checker (when ``checker``: it does not know ONNX Runtime's contrib operators such as
    ``SimplifiedLayerNormalization`` in the default domain, so a GenAI-built graph's check is
    ONNX Runtime loading it) plus the declared dynamic axes on inputs and outputs
    (``position_ids`` only in a left-padded graph: a right-padded one derives positions from
    the mask)."""
    import onnx

    problems: list[str] = []
    try:
        if checker:
            onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as e:
        problems.append(f"{path.name}: onnx.checker: {e}")
    model = onnx.load(str(path), load_external_data=False)
    caches = sum(1 for v in model.graph.input if v.name.endswith(".key"))
    if caches != layers:
        problems.append(f"{path.name}: {caches} layers' caches, the checkpoint has {layers}")
    want = {
        "input_ids": (BATCH_AXIS, SEQ_AXIS),
        "attention_mask": (BATCH_AXIS, TOTAL_AXIS),
        "logits": (BATCH_AXIS, SEQ_AXIS, None),
    }
    if layout == LEFT:
        want["position_ids"] = (BATCH_AXIS, SEQ_AXIS)
    want.update({n: (BATCH_AXIS, None, PAST_AXIS, None) for n in past_names(layers)})
    want.update({n: (BATCH_AXIS, None, TOTAL_AXIS, None) for n in present_names(layers)})
    seen = {v.name: v for v in (*model.graph.input, *model.graph.output)}
    for name, axes in want.items():
        if name not in seen:
            problems.append(f"{path.name}: tensor {name!r} is missing")
            continue
        dims = seen[name].type.tensor_type.shape.dim
        got = tuple(d.dim_param or None for d in dims)
        if len(got) != len(axes) or any(a and g != a for g, a in zip(got, axes, strict=False)):
            problems.append(f"{path.name}: {name} has axes {got}, expected {axes}")
    return problems


def quantize_weights_int8(src: Path, dst: Path, method: WeightOnlyQuantization) -> None:
    """Weight-only quantization (blockwise symmetric ``MatMulNBits``) as ``method`` declares.
    Measured here against dynamic MatMul quantization (``quantize_dynamic``, per-channel):
    dynamic was slower than fp32 per decode step and failed the perplexity gate (ratio 1.89;
    1.06 with lm_head and down_proj left in fp32), see docs/performance.md."""
    import logging

    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    # The quantizer logs a line per node at INFO (thousands); keep warnings only.
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    quantizer = MatMulNBitsQuantizer(
        str(src),
        bits=method.bits,
        block_size=method.block_size,
        is_symmetric=True,
        accuracy_level=method.accuracy_level,
    )
    quantizer.process()
    quantizer.model.save_model_to_file(str(dst), use_external_data_format=False)


def step_latency_ms(decoder: OrtDecoder, batch: int, past: int, repeats: int = 5) -> float:
    """Median time of one decode step (batch rows, ``past`` cached columns)."""
    cache = [np.zeros((batch, decoder.kv_heads, past, decoder.head_dim), np.float32)] * len(
        decoder.past
    )
    ids = np.full((batch, 1), 5, np.int64)
    mask = np.ones((batch, past + 1), np.int64)
    pos = np.full((batch, 1), past, np.int64)
    times = []
    for _ in range(repeats + 1):
        t = time.perf_counter()
        decoder(ids, mask, pos, cache)
        times.append(time.perf_counter() - t)
    return float(np.median(times[1:]) * 1000)
