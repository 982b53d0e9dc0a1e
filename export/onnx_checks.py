"""Structural checks of an exported ONNX graph: checker, shape inference, declared dynamic axes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, shape_inference

from tritonforge.export.spec import ExportSpec, TensorDecl

Dim = str | int | None


def dims_of(value_info: onnx.ValueInfoProto) -> list[Dim]:
    """``dim_param`` names, ``dim_value`` ints, None where unknown."""
    out: list[Dim] = []
    for d in value_info.type.tensor_type.shape.dim:
        if d.HasField("dim_param"):
            out.append(d.dim_param)
        elif d.HasField("dim_value"):
            out.append(int(d.dim_value))
        else:
            out.append(None)
    return out


def numpy_dtype_of(value_info: onnx.ValueInfoProto) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(value_info.type.tensor_type.elem_type))


def _check_decl(
    decl: TensorDecl, vi: onnx.ValueInfoProto | None, where: str, failures: list[str]
) -> None:
    if vi is None:
        failures.append(f"{where} {decl.name!r} is missing from the graph")
        return
    if not vi.type.tensor_type.HasField("shape"):
        if where == "graph input":
            failures.append(f"{where} {decl.name!r} has no shape")
        return
    got_dtype = numpy_dtype_of(vi)
    if got_dtype != np.dtype(decl.dtype):
        failures.append(f"{where} {decl.name!r}: dtype {got_dtype} but the spec says {decl.dtype}")
    dims = dims_of(vi)
    if len(dims) != len(decl.axes):
        failures.append(
            f"{where} {decl.name!r}: rank {len(dims)} {dims} but the spec declares "
            f"{len(decl.axes)} axes {list(decl.axes)}"
        )
        return
    for axis, (want, got) in enumerate(zip(decl.axes, dims, strict=True)):
        if isinstance(want, str) and isinstance(got, int):
            failures.append(
                f"{where} {decl.name!r} axis {axis} ({want!r}) is fixed to {got}: a size leaked "
                "into the graph (e.g. a reshape using a traced shape); make it symbolic"
            )
        elif isinstance(want, int) and isinstance(got, int) and want != got:
            failures.append(f"{where} {decl.name!r} axis {axis}: size {got}, spec says {want}")
        elif isinstance(want, int) and not isinstance(got, int):
            failures.append(
                f"{where} {decl.name!r} axis {axis} is symbolic ({got!r}) but the spec fixes it "
                f"to {want}: the derived Triton config would say -1 (e.g. an expand_as lost the "
                "static size; use broadcasting ops)"
            )


def check_graph(path: Path, spec: ExportSpec) -> list[str]:
    """Every problem found in the graph at ``path`` against ``spec``'s declared tensors (see
    :func:`check_declared`)."""
    return check_declared(path, spec.inputs, spec.outputs)


def check_declared(
    path: Path, inputs: Sequence[TensorDecl], outputs: Sequence[TensorDecl]
) -> list[str]:
    """Every problem found in the graph at ``path`` (empty list = fine).

    Runs ``onnx.checker`` (full check), strict shape inference, and checks that each declared
    dynamic axis is symbolic on the graph inputs and outputs, both as exported and as inferred
    from the inputs with the outputs' declared shapes removed (so a size baked into an internal
    reshape cannot hide behind the exporter's dynamic_axes annotation).
    """
    failures: list[str] = []
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except onnx.checker.ValidationError as e:
        failures.append(f"onnx.checker: {e}".strip())
    model = onnx.load(str(path))
    try:
        shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except Exception as e:  # onnx raises InferenceError / ValidationError variants
        failures.append(f"shape inference (strict): {type(e).__name__}: {e}".strip())
    graph_inputs = {vi.name: vi for vi in model.graph.input}
    graph_outputs = {vi.name: vi for vi in model.graph.output}
    for decl in inputs:
        _check_decl(decl, graph_inputs.get(decl.name), "graph input", failures)
    for decl in outputs:
        _check_decl(decl, graph_outputs.get(decl.name), "graph output", failures)

    stripped = onnx.ModelProto()
    stripped.CopyFrom(model)
    for vi in stripped.graph.output:
        vi.type.tensor_type.ClearField("shape")
    del stripped.graph.value_info[:]
    try:
        inferred = shape_inference.infer_shapes(stripped, check_type=False, strict_mode=False)
    except Exception as e:
        failures.append(f"shape inference from the inputs: {type(e).__name__}: {e}")
        return failures
    inferred_outputs = {vi.name: vi for vi in inferred.graph.output}
    for decl in outputs:
        before = len(failures)
        _check_decl(decl, inferred_outputs.get(decl.name), "inferred output", failures)
        # An output present in the graph but missing after inference is not a new finding.
        if decl.name not in inferred_outputs and decl.name in graph_outputs:
            del failures[before:]
    return failures


def graph_io(path: Path) -> tuple[list[tuple[str, np.dtype, list[Dim]]], ...]:
    """``(inputs, outputs)`` of a graph as (name, numpy dtype, dims) without loading weights."""
    model = onnx.load(str(path), load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}
    ins = [
        (vi.name, numpy_dtype_of(vi), dims_of(vi))
        for vi in model.graph.input
        if vi.name not in initializers
    ]
    outs = [(vi.name, numpy_dtype_of(vi), dims_of(vi)) for vi in model.graph.output]
    return ins, outs
