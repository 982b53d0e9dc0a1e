"""Bring your own ONNX: check a given graph, run it on a shape grid, derive its Triton tensors,
and write it into the model repository atomically with sha256 sidecars. Task-agnostic.

For token models (text encoders, classifiers, cross-encoders): every graph input is an integer
``[batch, sequence]`` tensor (``input_ids``, ``attention_mask``, ``token_type_ids``...). The
checks collect every problem and raise one :class:`OnnxImportError` listing them all:

1. ``onnx.checker`` (full), strict shape inference, and the inputs' and outputs' axes as the
   graph declares them and as inferred from the inputs alone (:func:`onnx_checks.check_declared`);
2. symbolic (named) batch and sequence axes on every input, the same names on each, an
   ``attention_mask`` input; outputs batched on the same axis name;
3. the grid: every (batch, length) shape runs, outputs have the declared shape and are finite;
4. padded rows equal the same rows run alone within ``atol`` (masking is exact).

The reference for served parity is the given graph in ONNX Runtime (no PyTorch involved).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from tritonforge.export.errors import VerificationError
from tritonforge.export.onnx_checks import check_declared
from tritonforge.export.parity import Runner, compare_outputs, ort_runner
from tritonforge.export.spec import BATCH_AXIS, Inputs, TensorDecl
from tritonforge.export.staging import Staging
from tritonforge.export.tritonconfig import ArtifactIO, IOTensor, onnx_io
from tritonforge.modelconfig import triton_dtype_of

MODEL_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"
MASK_INPUT = "attention_mask"
SEGMENT_INPUT = "token_type_ids"


class OnnxImportError(VerificationError):
    """A given ONNX graph cannot be served as is; ``failures`` lists every problem found."""

    title = "ONNX import failed"


@dataclass(frozen=True)
class GridSettings:
    """What the grid runs: ``shapes`` (batch, length) with full rows, one padded batch of
    ``mixed_lengths`` compared row by row with each row alone within ``atol`` (absolute, on
    every output), token ids drawn below ``vocab_size``, padding with ``pad_id``."""

    shapes: tuple[tuple[int, int], ...] = ((1, 4), (2, 16), (4, 64), (3, 128))
    mixed_lengths: tuple[int, ...] = (5, 17, 64, 9)
    atol: float = 1e-4
    vocab_size: int = 1000
    pad_id: int = 0
    seed: int = 0
    # real token ids (a tokenized text): rows are windows of it instead of random ids, so that
    # activations look like real ones (a dynamic int8 graph's error depends on them)
    token_pool: tuple[int, ...] = ()


@dataclass(frozen=True)
class ImportedGraph:
    """A checked graph: its tensors (batch axis included) and its symbolic axis names."""

    path: Path
    io: ArtifactIO
    batch_axis: str
    sequence_axis: str
    opset: int

    def triton_tensors(self) -> dict[str, list[dict[str, Any]]]:
        """``{"input": [...], "output": [...]}`` of ``{name, data_type, dims}`` for a batched
        config (batch axis dropped, symbolic axes -1): what config generation will render."""

        def one(t: IOTensor) -> dict[str, Any]:
            dims = [d if isinstance(d, int) else -1 for d in t.dims[1:]]
            return {"name": t.name, "data_type": triton_dtype_of(t.dtype), "dims": dims}

        return {
            "input": [one(t) for t in self.io.inputs],
            "output": [one(t) for t in self.io.outputs],
        }


def _axis_names(io: ArtifactIO, failures: list[str]) -> tuple[str, str]:
    """The batch and sequence axis names the inputs share; a failure for each input that is
    not an integer ``[symbolic, symbolic]`` tensor or names its axes differently."""
    names: set[tuple[str, str]] = set()
    for t in io.inputs:
        if t.dtype.kind not in "iu":
            failures.append(
                f"input {t.name!r} is {t.dtype}: only integer token inputs are supported"
            )
        if len(t.dims) != 2:
            failures.append(
                f"input {t.name!r} has rank {len(t.dims)} {list(t.dims)}: expected [batch, sequence]"
            )
            continue
        for axis, what in enumerate(("batch", "sequence")):
            if not isinstance(t.dims[axis], str):
                failures.append(
                    f"input {t.name!r} {what} axis {axis} is {t.dims[axis]!r}, not symbolic: "
                    "re-export with a named dynamic axis (torch.onnx dynamic_axes)"
                )
        if all(isinstance(d, str) for d in t.dims):
            names.add((str(t.dims[0]), str(t.dims[1])))
    if len(names) > 1:
        failures.append(f"the inputs name their axes differently: {sorted(names)}")
    if MASK_INPUT not in {t.name for t in io.inputs}:
        failures.append(f"no {MASK_INPUT!r} input: padded rows could not be masked")
    return min(names) if names else ("batch_size", "sequence")


def _output_failures(io: ArtifactIO, batch: str, sequence: str) -> list[str]:
    failures = []
    for t in io.outputs:
        if t.dtype.kind != "f":
            failures.append(f"output {t.name!r} is {t.dtype}: expected a float tensor")
        if not t.dims or t.dims[0] != batch:
            failures.append(f"output {t.name!r} dims {list(t.dims)}: axis 0 must be {batch!r}")
        for axis, d in enumerate(t.dims[1:], start=1):
            if not isinstance(d, int) and d != sequence:
                failures.append(
                    f"output {t.name!r} axis {axis} is {d!r}: a fixed size or {sequence!r} expected"
                )
    return failures


def _decls(
    io: ArtifactIO, atol: float = 0.0
) -> tuple[tuple[TensorDecl, ...], tuple[TensorDecl, ...]]:
    def decl(t: IOTensor) -> TensorDecl:
        axes = tuple(d if isinstance(d, int | str) else "?" for d in t.dims)
        return TensorDecl(t.name, str(t.dtype), axes, atol=atol)

    return tuple(decl(t) for t in io.inputs), tuple(decl(t) for t in io.outputs)


def inspect_graph(path: Path) -> ImportedGraph:
    """Steps 1 and 2 of the module docstring; :class:`OnnxImportError` lists every failure."""
    if not path.is_file():
        raise OnnxImportError([f"{path} does not exist: the directory needs a {MODEL_FILE}"])
    try:
        io = onnx_io(path)
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # onnx raises DecodeError and friends for a file that is no graph
        raise OnnxImportError(
            [f"{path} is not a readable ONNX graph: {type(e).__name__}: {e}"]
        ) from e
    failures: list[str] = []
    batch, sequence = _axis_names(io, failures)
    failures += _output_failures(io, batch, sequence)
    inputs, outputs = _decls(io)
    failures += check_declared(path, inputs, outputs)
    if failures:
        raise OnnxImportError(failures, str(path))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    return ImportedGraph(path, io, batch, sequence, int(opset))


def _ids(rng: np.random.Generator, settings: GridSettings, rows: int, width: int) -> np.ndarray:
    pool = np.asarray(settings.token_pool, dtype=np.int64)
    if pool.size <= width:
        return rng.integers(0, settings.vocab_size, size=(rows, width))
    starts = rng.integers(0, pool.size - width, size=rows)
    return np.stack([pool[s : s + width] for s in starts])


def token_inputs(
    graph: ImportedGraph, lengths: Sequence[int], rng: np.random.Generator, settings: GridSettings
) -> Inputs:
    """One row per length, padded to the longest: random ids, mask 1 on the row's tokens,
    segment 0 then 1 (a pair) where the graph takes ``token_type_ids``."""
    rows, width = len(lengths), max(lengths)
    mask = (np.arange(width)[None, :] < np.asarray(lengths)[:, None]).astype(np.int64)
    out: Inputs = {}
    for t in graph.io.inputs:
        if t.name == MASK_INPUT:
            value = mask
        elif t.name == SEGMENT_INPUT:
            value = (np.arange(width)[None, :] >= (np.asarray(lengths)[:, None] // 2)) * mask
        else:
            ids = _ids(rng, settings, rows, width)
            value = np.where(mask == 1, ids, settings.pad_id)
        out[t.name] = np.ascontiguousarray(value, dtype=t.dtype)
    return out


def _shape_failures(
    graph: ImportedGraph, label: str, got: Mapping[str, np.ndarray], batch: int, length: int
) -> list[str]:
    failures = []
    for t in graph.io.outputs:
        value = got.get(t.name)
        if value is None:
            failures.append(f"{label}: output {t.name!r} missing")
            continue
        want = [
            batch if i == 0 else length if d == graph.sequence_axis else d
            for i, d in enumerate(t.dims)
        ]
        if list(value.shape) != want:
            failures.append(
                f"{label}: output {t.name!r} shape {list(value.shape)}, expected {want}"
            )
        elif not np.all(np.isfinite(value)):
            failures.append(f"{label}: output {t.name!r} has non-finite values")
    return failures


def run_grid(graph: ImportedGraph, runner: Runner, settings: GridSettings) -> list[str]:
    """Steps 3 and 4 of the module docstring: every failure (exceptions included)."""
    rng = np.random.default_rng(settings.seed)
    failures: list[str] = []
    for batch, length in settings.shapes:
        label = f"batch={batch} seq={length}"
        try:
            got = runner(token_inputs(graph, [length] * batch, rng, settings))
        except Exception as e:
            failures.append(f"{label}: {type(e).__name__}: {e}"[:500])
            continue
        failures += _shape_failures(graph, label, got, batch, length)
    lengths = settings.mixed_lengths
    feed = token_inputs(graph, lengths, rng, settings)
    try:
        padded = runner(feed)
    except Exception as e:
        return [*failures, f"padded batch {list(lengths)}: {type(e).__name__}: {e}"[:500]]
    _, outputs = _decls(graph.io, settings.atol)
    for row, n in enumerate(lengths):
        alone = runner({k: v[row : row + 1, :n] for k, v in feed.items()})
        want = {}
        for t in graph.io.outputs:
            cut = [slice(row, row + 1)] + [
                slice(0, n) if d == graph.sequence_axis else slice(None) for d in t.dims[1:]
            ]
            want[t.name] = padded[t.name][tuple(cut)]
        _, problems = compare_outputs(
            outputs, f"row {row} of {n} tokens padded to {max(lengths)} vs alone", alone, want
        )
        failures += problems
    return failures


def verify_graph(path: Path, settings: GridSettings, threads: int = 1) -> ImportedGraph:
    """:func:`inspect_graph`, then :func:`run_grid` on ONNX Runtime; raises
    :class:`OnnxImportError` listing every failure."""
    graph = inspect_graph(path)
    failures = run_grid(graph, ort_runner(path, threads), settings)
    if failures:
        raise OnnxImportError(failures, str(path))
    return graph


def rename_axes(model: onnx.ModelProto, names: Mapping[str, str]) -> int:
    """Rename symbolic axes (``dim_param``) of the graph's inputs, outputs and value infos in
    place; returns how many dims changed."""
    changed = 0
    graph = model.graph
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        for dim in vi.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in names:
                dim.dim_param = names[dim.dim_param]
                changed += 1
    return changed


def axis_renames(graph: ImportedGraph) -> dict[str, str]:
    """What :func:`write_model` renames so that the batch axis is the project's
    :data:`BATCH_AXIS` (the config check and the batching match axes by name)."""
    return {graph.batch_axis: BATCH_AXIS} if graph.batch_axis != BATCH_AXIS else {}


def write_model(
    repo: Path,
    model: str,
    files: Mapping[str, Path],
    version: int = 1,
    renames: Mapping[str, str] | None = None,
) -> list[str]:
    """Copy ``files`` (destination name -> source) into ``repo/model/version/`` as one unit:
    staged beside the repository, sealed with ``.sha256`` sidecars, then moved in; on any
    error the repository is left as it was. ``renames`` (:func:`axis_renames`) are applied to
    the ``.onnx`` files (then no longer byte-identical to the given ones; the same numbers).
    Returns the repository paths written."""
    staging = Staging(repo)
    try:
        target = staging.version_dir(model, version)
        for name, source in files.items():
            if renames and name.endswith(".onnx"):
                graph = onnx.load(str(source))
                rename_axes(graph, renames)
                onnx.save(graph, str(target / name))
            else:
                shutil.copyfile(source, target / name)
        staging.seal()
        return staging.commit()
    finally:
        staging.discard()
