"""The int8 audit: every scale and zero point of a quantized graph, QDQ (static) or
MatMulInteger (dynamic); each problem names the node and what is wrong."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

MIN_SCALE = 1e-8


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(attr.t)
    return values


def _ranks(model: onnx.ModelProto, constants: dict[str, np.ndarray]) -> dict[str, int]:
    ranks = {k: v.ndim for k, v in constants.items()}
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        inferred = model
    for vi in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output):
        if vi.type.tensor_type.HasField("shape"):
            ranks.setdefault(vi.name, len(vi.type.tensor_type.shape.dim))
    return ranks


def audit_qdq(model: onnx.ModelProto) -> tuple[list[str], dict[str, int]]:
    """Check every QuantizeLinear/DequantizeLinear; returns ``(problems, counts)``.

    Scale: constant, finite, > 0 and >= 1e-8 (not denormal). Zero point: integer dtype, within
    its range, same shape as the scale. Per-channel: axis valid for the input's rank and the
    scale's length equal to that axis' size. Pairs: every Q feeds only DQs that use the same
    scale, zero point and axis.
    """
    problems: list[str] = []
    constants = _constants(model)
    ranks = _ranks(model, constants)
    nodes = [n for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    counts = {
        "QuantizeLinear": sum(n.op_type == "QuantizeLinear" for n in nodes),
        "DequantizeLinear": sum(n.op_type == "DequantizeLinear" for n in nodes),
    }
    params: dict[str, _QParams] = {}
    for index, node in enumerate(nodes):
        label = f"{node.op_type} {node.name or f'#{index}'}"
        params[node.name] = _check_qdq_node(label, node, constants, ranks, problems)
    _check_pairs(model, nodes, params, problems)
    return problems, counts


_QParams = tuple[np.ndarray | None, np.ndarray | None, int]  # scale, zero point, axis


def _check_qdq_node(
    label: str,
    node: onnx.NodeProto,
    constants: dict[str, np.ndarray],
    ranks: dict[str, int],
    problems: list[str],
) -> _QParams:
    """One Q or DQ node's scale, zero point and per-channel axis; returns them."""
    axis = next((int(a.i) for a in node.attribute if a.name == "axis"), 1)
    scale = constants.get(node.input[1]) if len(node.input) > 1 else None
    zp = constants.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if scale is None:
        problems.append(f"{label}: scale {node.input[1]!r} is not a constant")
        return scale, zp, axis
    _check_scale(label, node.input[1], scale, problems)
    if zp is not None:
        _check_zero_point(label, zp, scale, problems)
    if scale.ndim == 1 and scale.size > 1:
        # per-channel: a valid axis of the input with as many channels as scales
        tensor, rank = node.input[0], ranks.get(node.input[0])
        if rank is None:
            problems.append(f"{label}: per-channel but the rank of {tensor!r} is unknown")
        elif not -rank <= axis < rank:
            problems.append(f"{label}: per-channel axis {axis} invalid for rank {rank}")
        elif tensor in constants and constants[tensor].shape[axis] != scale.size:
            problems.append(
                f"{label}: per-channel scale has {scale.size} values but axis {axis} of "
                f"{tensor!r} has size {constants[tensor].shape[axis]}"
            )
    elif scale.ndim > 1:
        problems.append(f"{label}: scale rank {scale.ndim} (blocked) is not supported here")
    return scale, zp, axis


def _check_zero_point(label: str, zp: np.ndarray, scale: np.ndarray, problems: list[str]) -> None:
    if zp.dtype.kind not in "iu":
        problems.append(f"{label}: zero point dtype {zp.dtype} is not an integer type")
    else:
        info = np.iinfo(zp.dtype)
        if zp.size and (zp.min() < info.min or zp.max() > info.max):
            problems.append(f"{label}: zero point outside {zp.dtype} range")
    if zp.shape != scale.shape:
        problems.append(f"{label}: zero point shape {zp.shape} != scale shape {scale.shape}")


def _same_params(a: _QParams, b: _QParams) -> bool:
    (s1, z1, a1), (s2, z2, a2) = a, b
    if s1 is None or s2 is None or s1.shape != s2.shape:
        return False
    if not np.array_equal(s1, s2, equal_nan=True):
        return False
    if (z1 is None) != (z2 is None):
        return False
    if z1 is not None and z2 is not None and (z1.dtype != z2.dtype or not np.array_equal(z1, z2)):
        return False
    return s1.size == 1 or a1 == a2


def _check_pairs(
    model: onnx.ModelProto,
    nodes: list[onnx.NodeProto],
    params: dict[str, _QParams],
    problems: list[str],
) -> None:
    """Every Q feeds only DQs with its scale, zero point and axis."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    for node in nodes:
        if node.op_type != "QuantizeLinear":
            continue
        for user in consumers.get(node.output[0], []):
            if user.op_type != "DequantizeLinear":
                problems.append(
                    f"QuantizeLinear {node.name}: output feeds {user.op_type} {user.name}, "
                    "not a DequantizeLinear"
                )
            elif not _same_params(params[node.name], params[user.name]):
                problems.append(
                    f"Q/DQ pair {node.name} -> {user.name}: scale/zero point/axis differ"
                )


def _check_scale(label: str, name: str, scale: np.ndarray, problems: list[str]) -> None:
    s = scale.astype(np.float64)
    bad = ~np.isfinite(s)
    if bad.any():
        problems.append(f"{label}: scale {name!r} has {int(bad.sum())} non-finite value(s)")
    finite = s[np.isfinite(s)]
    if (finite <= 0).any():
        problems.append(f"{label}: scale {name!r} has {int((finite <= 0).sum())} value(s) <= 0")
    tiny = (finite > 0) & (finite < MIN_SCALE)
    if tiny.any():
        problems.append(
            f"{label}: scale {name!r} has {int(tiny.sum())} value(s) below {MIN_SCALE:g} "
            "(denormal range)"
        )


def audit_dynamic(model: onnx.ModelProto) -> tuple[list[str], dict[str, int]]:
    """Check every MatMulInteger of a dynamically quantized graph; ``(problems, counts)``.

    Weight: a constant 2-D integer tensor. Weight zero point: constant, integer, within range,
    one value or one per output channel. Weight scale (the constant factor of the
    ``a_scale * b_scale`` Mul that rescales the int32 result): finite, > 0, >= 1e-8, one value or
    one per output channel, as many as the zero points. Activations: quantized at run time by a
    DynamicQuantizeLinear (its scale/zero point are computed, not stored).
    """
    problems: list[str] = []
    constants = _constants(model)
    producer = {o: n for n in model.graph.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    matmuls = [n for n in model.graph.node if n.op_type == "MatMulInteger"]
    counts = {
        "MatMulInteger": len(matmuls),
        "DynamicQuantizeLinear": sum(
            n.op_type == "DynamicQuantizeLinear" for n in model.graph.node
        ),
    }
    for index, node in enumerate(matmuls):
        label = f"MatMulInteger {node.name or f'#{index}'}"
        a_src = producer.get(node.input[0])
        if a_src is None or a_src.op_type != "DynamicQuantizeLinear":
            problems.append(f"{label}: activation is not quantized by a DynamicQuantizeLinear")
        weight = constants.get(node.input[1])
        if weight is None or weight.dtype.kind not in "iu" or weight.ndim != 2:
            problems.append(f"{label}: weight {node.input[1]!r} is not a constant 2-D int tensor")
            continue
        channels = weight.shape[1]
        zp = constants.get(node.input[3]) if len(node.input) > 3 and node.input[3] else None
        if zp is None:
            problems.append(f"{label}: weight zero point is missing or not a constant")
        else:
            if zp.dtype != weight.dtype:
                problems.append(f"{label}: zero point dtype {zp.dtype} != weight {weight.dtype}")
            if zp.size not in (1, channels):
                problems.append(f"{label}: {zp.size} zero points for {channels} channels")
        cast = next(iter(consumers.get(node.output[0], [])), None)
        rescale = next(iter(consumers.get(cast.output[0], []))) if cast is not None else None
        if cast is None or cast.op_type != "Cast" or rescale is None or rescale.op_type != "Mul":
            problems.append(f"{label}: result is not rescaled by Cast -> Mul")
            continue
        factor = next((producer.get(i) for i in rescale.input if producer.get(i) is not cast), None)
        scales = [
            constants[i] for i in (factor.input if factor is not None else ()) if i in constants
        ]
        if factor is None or factor.op_type != "Mul" or len(scales) != 1:
            problems.append(f"{label}: no constant weight scale in the rescaling Mul")
            continue
        _check_scale(label, factor.input[-1], scales[0], problems)
        if scales[0].size not in (1, channels) or (zp is not None and zp.size != scales[0].size):
            problems.append(
                f"{label}: {scales[0].size} scales for {channels} channels"
                + (f" and {zp.size} zero points" if zp is not None else "")
            )
    return problems, counts


def audit_int8(model: onnx.ModelProto) -> tuple[list[str], dict[str, int]]:
    """Both audits (QDQ pairs and dynamic MatMulInteger); a graph has the nodes of one format."""
    qdq, qdq_counts = audit_qdq(model)
    dyn, dyn_counts = audit_dynamic(model)
    if not any((*qdq_counts.values(), *dyn_counts.values())):
        return ["no quantized node in the int8 graph"], {**qdq_counts, **dyn_counts}
    return qdq + dyn, {**qdq_counts, **dyn_counts}
