"""Merge the requests of one ``execute`` call into batched inferences and split the results back.

Triton's dynamic batcher hands a model several requests at once; a Python-based backend must run
them as one inference itself. Requests whose non-batch shapes differ are padded to a common shape
only where the model declares a pad value for the input (e.g. ``attention_mask`` 0), otherwise they
are grouped by shape. Output axes that share a *name* with a padded input axis (ONNX ``dim_param``
such as ``sequence_length``) are cut back to each request's own extent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tritonforge.errors import InvalidInputError, ModelConfigError
from tritonforge.modelconfig import ModelConfig

AxisNames = Mapping[str, Sequence[str | None]]
"""Per tensor, one name (or None) per axis *including* the batch axis."""


@dataclass(frozen=True)
class Member:
    """Where one request's rows sit inside a merged batch."""

    request_index: int
    start: int
    stop: int
    axis_sizes: Mapping[str, int] = field(default_factory=dict)


@dataclass
class Batch:
    """One inference to run: merged inputs plus the members to split the outputs back to."""

    inputs: dict[str, np.ndarray]
    members: list[Member]

    @property
    def size(self) -> int:
        return sum(m.stop - m.start for m in self.members)


def validate_inputs(config: ModelConfig, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Check one request against the config; raise :class:`InvalidInputError` naming the field.

    Returns the inputs that the model consumes (unknown names are an error, optional ones may be
    absent).
    """
    known = {spec.name for spec in config.inputs}
    unknown = sorted(set(inputs) - known)
    if unknown:
        raise InvalidInputError(
            f"unexpected input {unknown[0]!r} for model {config.name!r}; expected {sorted(known)}"
        )
    out: dict[str, np.ndarray] = {}
    batch: int | None = None
    for spec in config.inputs:
        if spec.name not in inputs:
            if spec.optional:
                continue
            raise InvalidInputError(f"input {spec.name!r} is missing for model {config.name!r}")
        arr = np.asarray(inputs[spec.name])
        want = np.dtype(spec.numpy_dtype)
        if want.kind == "O":
            if arr.dtype.kind not in ("O", "S", "U"):
                raise InvalidInputError(
                    f"input {spec.name!r} must be {spec.wire_dtype}, got {arr.dtype}"
                )
        elif arr.dtype != want:
            raise InvalidInputError(
                f"input {spec.name!r} must be {spec.wire_dtype}, got {arr.dtype.name}"
            )
        expected = spec.full_shape(config.batched)
        if arr.ndim != len(expected):
            raise InvalidInputError(
                f"input {spec.name!r} must have rank {len(expected)} "
                f"(shape {list(expected)}), got shape {list(arr.shape)}"
            )
        for axis, (got, dim) in enumerate(zip(arr.shape, expected, strict=True)):
            if dim != -1 and got != dim:
                raise InvalidInputError(
                    f"input {spec.name!r} axis {axis} must be {dim}, got shape {list(arr.shape)}"
                )
        if config.batched:
            if arr.shape[0] < 1:
                raise InvalidInputError(f"input {spec.name!r} has an empty batch")
            if arr.shape[0] > config.max_batch_size:
                raise InvalidInputError(
                    f"input {spec.name!r} batch {arr.shape[0]} exceeds max_batch_size "
                    f"{config.max_batch_size}"
                )
            if batch is None:
                batch = arr.shape[0]
            elif arr.shape[0] != batch:
                raise InvalidInputError(
                    f"input {spec.name!r} has batch {arr.shape[0]} but other inputs have {batch}"
                )
        out[spec.name] = arr
    return out


def _sizes(inputs: Mapping[str, np.ndarray], axis_names: AxisNames) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for name, arr in inputs.items():
        for axis, axis_name in enumerate(axis_names.get(name, ())):
            if axis > 0 and axis_name and axis < arr.ndim:
                sizes[axis_name] = int(arr.shape[axis])
    return sizes


def _pad_to(arr: np.ndarray, shape: Sequence[int], value: float | int) -> np.ndarray:
    if tuple(arr.shape[1:]) == tuple(shape):
        return arr
    widths = [(0, 0)] + [(0, int(t) - int(s)) for s, t in zip(arr.shape[1:], shape, strict=True)]
    return np.pad(arr, widths, mode="constant", constant_values=value)


def _merge(
    group: Sequence[tuple[int, Mapping[str, np.ndarray]]],
    pad_values: Mapping[str, float | int],
    axis_names: AxisNames,
) -> Batch:
    names = list(group[0][1].keys())
    targets = {
        n: tuple(np.max([list(req[n].shape[1:]) for _, req in group], axis=0).tolist())
        if group[0][1][n].ndim > 1
        else ()
        for n in names
    }
    members: list[Member] = []
    row = 0
    for index, req in group:
        rows = int(next(iter(req.values())).shape[0]) if req else 0
        members.append(Member(index, row, row + rows, _sizes(req, axis_names)))
        row += rows
    merged = {
        n: np.concatenate([_pad_to(req[n], targets[n], pad_values.get(n, 0)) for _, req in group])
        for n in names
    }
    return Batch(inputs=merged, members=members)


def plan_batches(
    requests: Sequence[tuple[int, Mapping[str, np.ndarray]]],
    pad_values: Mapping[str, float | int] | None = None,
    axis_names: AxisNames | None = None,
) -> list[Batch]:
    """Turn validated requests ``(index, inputs)`` into as few batched inferences as allowed.

    With ``pad_values`` covering every input whose non-batch shape varies, all requests become one
    batch; otherwise requests are grouped by identical non-batch shapes.
    """
    pad_values = pad_values or {}
    axis_names = axis_names or {}
    if not requests:
        return []
    shapes = {
        n: {tuple(req[n].shape[1:]) for _, req in requests if n in req} for n in requests[0][1]
    }
    varying = {n for n, s in shapes.items() if len(s) > 1}
    present = [frozenset(req) for _, req in requests]
    if len(set(present)) == 1 and varying <= set(pad_values):
        return [_merge(requests, pad_values, axis_names)]
    groups: dict[tuple[object, ...], list[tuple[int, Mapping[str, np.ndarray]]]] = {}
    for index, req in requests:
        key = tuple(sorted((n, a.shape[1:]) for n, a in req.items()))
        groups.setdefault(key, []).append((index, req))
    return [_merge(g, {}, axis_names) for g in groups.values()]


def split_outputs(
    outputs: Mapping[str, np.ndarray], batch: Batch, axis_names: AxisNames | None = None
) -> list[tuple[int, dict[str, np.ndarray]]]:
    """Slice each member's rows out of batched ``outputs``, unpadding named dynamic axes."""
    axis_names = axis_names or {}
    result: list[tuple[int, dict[str, np.ndarray]]] = []
    for m in batch.members:
        per: dict[str, np.ndarray] = {}
        for name, arr in outputs.items():
            part = arr[m.start : m.stop]
            index: list[slice] = [slice(None)] * part.ndim
            for axis, axis_name in enumerate(axis_names.get(name, ())):
                if axis > 0 and axis_name and axis_name in m.axis_sizes and axis < part.ndim:
                    index[axis] = slice(0, m.axis_sizes[axis_name])
            per[name] = np.ascontiguousarray(part[tuple(index)])
        result.append((m.request_index, per))
    return result


def row_extents(
    inputs: Mapping[str, np.ndarray],
    row: int,
    pad_values: Mapping[str, float | int],
    axis_names: AxisNames,
) -> dict[str, int]:
    """Axis name -> the length of ``row`` without its trailing padding: the last position where
    some padded input differs from its pad value, plus one (at least 1)."""
    return batch_extents(
        {name: arr[row : row + 1] for name, arr in inputs.items()}, pad_values, axis_names
    )


def _slice_row(
    arr: np.ndarray, row: int, names: Sequence[str | None], extents: Mapping[str, int]
) -> np.ndarray:
    index: list[slice] = [slice(row, row + 1)]
    for axis in range(1, arr.ndim):
        name = names[axis] if axis < len(names) else None
        index.append(slice(0, extents[name]) if name and name in extents else slice(None))
    return np.ascontiguousarray(arr[tuple(index)])


def infer_rows(
    inputs: Mapping[str, np.ndarray],
    infer: Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]],
    pad_values: Mapping[str, float | int],
    axis_names: AxisNames,
) -> dict[str, np.ndarray]:
    """Run a merged batch one row at a time, each row cut to its own unpadded extent, and stack
    the outputs (named axes padded back with zeros to the batch's extent).

    For graphs whose activations are quantized with one scale per tensor (dynamic int8): there a
    row's answer depends on every other row and on the padding beside it; alone and unpadded it
    depends on its own values only, so an answer no longer depends on who shares the batch."""
    batch = int(next(iter(inputs.values())).shape[0])
    rows: list[Mapping[str, np.ndarray]] = []
    for r in range(batch):
        extents = row_extents(inputs, r, pad_values, axis_names)
        rows.append(
            infer({n: _slice_row(a, r, axis_names.get(n, ()), extents) for n, a in inputs.items()})
        )
    full = _sizes(inputs, axis_names)
    out: dict[str, np.ndarray] = {}
    for name in rows[0]:
        names = axis_names.get(name, ())
        parts = []
        for part in rows:
            arr = part[name]
            widths = [(0, 0)]
            for a in range(1, arr.ndim):
                axis_name = names[a] if a < len(names) else None
                grow = full[axis_name] - arr.shape[a] if axis_name and axis_name in full else 0
                widths.append((0, grow))
            parts.append(np.pad(arr, widths) if any(w for _, w in widths) else arr)
        out[name] = np.concatenate(parts)
    return out


def batch_extents(
    inputs: Mapping[str, np.ndarray],
    pad_values: Mapping[str, float | int],
    axis_names: AxisNames,
) -> dict[str, int]:
    """Axis name -> the batch's length without the padding every row shares at its end: the last
    position where some row of some padded input differs from its pad value, plus one (at least
    1)."""
    extents: dict[str, int] = {}
    for name, arr in inputs.items():
        if name not in pad_values:
            continue
        for axis, axis_name in enumerate(axis_names.get(name, ())):
            if axis == 0 or not axis_name or axis >= arr.ndim:
                continue
            part = np.moveaxis(arr, axis, 0).reshape(arr.shape[axis], -1)
            used = np.flatnonzero((part != pad_values[name]).any(axis=1))
            extents[axis_name] = max(
                extents.get(axis_name, 1), int(used[-1]) + 1 if used.size else 1
            )
    return extents


def _pad_back(arr: np.ndarray, names: Sequence[str | None], full: Mapping[str, int]) -> np.ndarray:
    widths = [(0, 0)]
    for a in range(1, arr.ndim):
        axis_name = names[a] if a < len(names) else None
        widths.append((0, full[axis_name] - arr.shape[a] if axis_name and axis_name in full else 0))
    return np.pad(arr, widths) if any(w for _, w in widths) else arr


def infer_trimmed(
    inputs: Mapping[str, np.ndarray],
    infer: Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]],
    pad_values: Mapping[str, float | int],
    axis_names: AxisNames,
) -> dict[str, np.ndarray]:
    """Run a batch cut to :func:`batch_extents` (named outputs padded back with zeros to the
    inputs' extent, so :func:`split_outputs` still applies).

    The tokenizer pads every text to a multiple of 16 tokens (so that same-bucket requests can
    batch on a GPU); on a CPU the trailing padding is computed like real tokens, ~15-25% of an
    encoder call on the corpus (docs/performance.md). A lone request then runs at its own length,
    exactly like the in-process limit. Only positions where *every* padded input holds its pad
    value in *every* row are cut, i.e. positions the model masks out anyway."""
    extents = batch_extents(inputs, pad_values, axis_names)
    full = _sizes(inputs, axis_names)
    if all(full.get(n) == e for n, e in extents.items()):
        return dict(infer(dict(inputs)))
    cut: dict[str, np.ndarray] = {}
    for n, a in inputs.items():
        names = axis_names.get(n, ())
        index = [slice(None)] * a.ndim
        for axis in range(1, a.ndim):
            name = names[axis] if axis < len(names) else None
            if name and name in extents:
                index[axis] = slice(0, extents[name])
        cut[n] = np.ascontiguousarray(a[tuple(index)])
    return {n: _pad_back(v, axis_names.get(n, ()), full) for n, v in infer(cut).items()}


# Ops whose output scale spans the whole input tensor (every row and the padding of a batch).
PER_TENSOR_DYNAMIC_OPS = frozenset({"DynamicQuantizeLinear", "DynamicQuantizeMatMul"})
BATCH_ROWS = ("auto", "together", "alone")


def rows_alone(path: Path, setting: str) -> bool:
    """Whether a model runs its rows one by one (:func:`infer_rows`): ``setting`` is the config's
    ``batch_rows``; ``auto`` decides from the ONNX graph at ``path`` (any op of
    :data:`PER_TENSOR_DYNAMIC_OPS`). :class:`ModelConfigError` for another setting."""
    if setting not in BATCH_ROWS:
        raise ModelConfigError(f"batch_rows must be one of {list(BATCH_ROWS)}, got {setting!r}")
    if setting != "auto":
        return setting == "alone"
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return any(node.op_type in PER_TENSOR_DYNAMIC_OPS for node in graph.node)
