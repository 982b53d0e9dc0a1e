"""torch.onnx export of a spec's module with named dynamic axes."""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path

import numpy as np
import torch

from tritonforge.export.errors import ExportError
from tritonforge.export.spec import ExportSpec


def trace_inputs(spec: ExportSpec, seed: int = 1) -> tuple[torch.Tensor, ...]:
    """The example the exporter traces with; batch and every dynamic size >= 2 so that no
    dynamic axis can be specialised to 1."""
    lengths = spec.trace_lengths
    if len(lengths) < 2 or min(lengths) < 2:
        raise ExportError(f"spec {spec.name}: trace_lengths {lengths} needs batch >= 2, seq >= 2")
    example = spec.example_inputs(lengths, np.random.default_rng(seed))
    return tuple(torch.from_numpy(example[t.name]) for t in spec.inputs)


def torch_to_onnx(
    module: torch.nn.Module,
    args: tuple[torch.Tensor, ...],
    path: Path,
    names: tuple[list[str], list[str]],
    dynamic_axes: dict[str, dict[int, str]],
    opset: int,
    what: str,
    no_grad: bool = False,
) -> None:
    """torch.onnx.export (TorchScript-based, constant folding) with its warnings and stderr
    captured (under ``torch.no_grad`` when asked); a failure raises :class:`ExportError` naming
    ``what`` with the log's tail."""
    log = io.StringIO()
    grad = torch.no_grad() if no_grad else contextlib.nullcontext()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(log), grad:
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module,
                args,
                str(path),
                input_names=names[0],
                output_names=names[1],
                dynamic_axes=dynamic_axes,
                opset_version=opset,
                do_constant_folding=True,
                dynamo=False,
            )
    except Exception as e:
        raise ExportError(
            f"torch.onnx.export of {what} failed: {type(e).__name__}: {e}\n{log.getvalue()[-2000:]}"
        ) from e


def export_onnx(module: torch.nn.Module, spec: ExportSpec, path: Path) -> None:
    """Export ``module`` to ``path`` (opset ``spec.opset``, TorchScript-based exporter)."""
    if spec.opset < 17:
        raise ExportError(f"spec {spec.name}: opset {spec.opset} < 17 is not supported")
    torch_to_onnx(
        module,
        trace_inputs(spec),
        path,
        ([t.name for t in spec.inputs], [t.name for t in spec.outputs]),
        {t.name: t.dynamic_axes for t in (*spec.inputs, *spec.outputs)},
        spec.opset,
        f"spec {spec.name}",
    )
