"""TorchScript export: trace, save, reload from disk (what the PyTorch backend will load)."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from tritonforge.export.errors import ExportError
from tritonforge.export.onnx_export import trace_inputs
from tritonforge.export.parity import Runner, torch_runner
from tritonforge.export.spec import ExportSpec


def export_torchscript(module: torch.nn.Module, spec: ExportSpec, path: Path) -> None:
    args = trace_inputs(spec)
    try:
        with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(module, args, check_trace=True, strict=True)
            torch.jit.save(traced, str(path))
    except Exception as e:
        raise ExportError(f"torch.jit.trace of spec {spec.name} failed: {e}") from e


def torchscript_runner(path: Path, spec: ExportSpec) -> Runner:
    """Reload ``path`` from disk and call it positionally, like the native PyTorch backend."""
    return torch_runner(torch.jit.load(str(path), map_location="cpu").eval(), spec)
