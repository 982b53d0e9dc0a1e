"""A TorchScript traced on the CPU must run on a GPU: no device frozen into the trace.

The native PyTorch backend serves ``model.pt`` on the GPU when ``configs/gpu.pbtxt`` says
``KIND_GPU``; a tensor that ``forward`` creates with the input's device is frozen to the CPU by
the trace and fails there (seen on an H200 with ``tritonforge.deploy.torchscript_gpu``). This
checks the rule on the CPU: no ``torch.device("cpu")`` in any traced module's code.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests import tiny_checkpoints
from tritonforge.export.models import hf


def _devices_in_trace(traced: torch.jit.ScriptModule) -> list[str]:
    return [
        line.strip()
        for _, module in traced.named_modules()
        for line in (getattr(module, "code", "") or "").splitlines()
        if "torch.device(" in line
    ]


CHECKPOINTS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "bert": (lambda d: tiny_checkpoints.bert(d, ["hello", "world", "good", "bad"]), "embedding"),
    "distilbert": (tiny_checkpoints.distilbert, "embedding"),
    "roberta": (lambda d: tiny_checkpoints.roberta(d, tiny_checkpoints.LABELS), "classification"),
}


@pytest.mark.parametrize("kind", sorted(CHECKPOINTS))
def test_traced_encoder_names_no_device_and_keeps_its_outputs(kind: str, tmp_path: Path) -> None:
    make, task = CHECKPOINTS[kind]
    info = hf.inspect_checkpoint(make(tmp_path / kind))
    encoder = hf.load_hf_encoder(info, task)
    ids = torch.tensor([[2, 5, 6, 7, 3], [2, 5, 3, 0, 0]])
    mask = (ids != 0).long()
    inputs = (ids, mask, torch.zeros_like(ids))[: len(info.input_names)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(encoder, inputs, check_trace=True, strict=True)
    assert _devices_in_trace(traced) == []
    # Same values as transformers' own call with the 2-D mask (what the ONNX export traces).
    plain = encoder.model(**dict(zip(info.input_names, inputs, strict=True)))
    with torch.no_grad():
        got = traced(*inputs)
    if encoder.logits:
        torch.testing.assert_close(got, plain.logits, rtol=0, atol=1e-6)
    else:
        hidden = plain.last_hidden_state
        weights = mask.to(hidden.dtype).unsqueeze(-1)
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1)
        if encoder.normalize:
            pooled = torch.nn.functional.normalize(pooled, dim=1)
        torch.testing.assert_close(got, pooled, rtol=0, atol=1e-6)
