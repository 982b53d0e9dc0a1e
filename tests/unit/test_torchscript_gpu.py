"""The TorchScript GPU check's pure parts: discovery, the inputs it feeds, its report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tritonforge.deploy import torchscript_gpu as tg
from tritonforge.deploy.gpu_check import EXIT_NO_GPU, Parity


def _model(repo: Path, name: str, body: str) -> Path:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\n{body}')
    return repo / name


ENCODER = """backend: "pytorch"
max_batch_size: 8
input { name: "INPUT__1" data_type: TYPE_INT64 dims: -1 }
input { name: "INPUT__0" data_type: TYPE_INT64 dims: -1 }
output { name: "OUTPUT__0" data_type: TYPE_FP32 dims: 4 }
"""


def test_discovers_only_pytorch_backend_models(tmp_path: Path) -> None:
    _model(tmp_path, "enc_ts", ENCODER)
    _model(tmp_path, "enc_onnx", 'backend: "onnxruntime"\n')
    _model(tmp_path, "tok", 'backend: "python"\n')
    assert tg.torchscript_models(tmp_path) == ["enc_ts"]


def test_inputs_follow_the_backends_positional_order() -> None:
    from tritonforge.modelconfig import pbtxt_to_dict

    specs = tg.input_specs(pbtxt_to_dict(ENCODER))
    assert [s.name for s in specs] == ["INPUT__0", "INPUT__1"]
    assert all(s.dims == (-1,) and s.dtype is np.int64 for s in specs)


def test_unfed_dtype_is_a_clear_error() -> None:
    with pytest.raises(tg.GpuCheckError, match="INPUT__0: TYPE_STRING"):
        tg.input_specs({"input": [{"name": "INPUT__0", "data_type": "TYPE_STRING", "dims": [1]}]})


def test_token_inputs_are_valid_ids_a_padded_mask_and_zero_types() -> None:
    specs = [tg.TensorSpec(f"INPUT__{i}", np.int64, (-1,)) for i in range(3)]
    ids, mask, types = tg.make_inputs(specs, batch=6, seq_len=16, vocab_ids=np.array([2, 7, 9]))
    assert ids.shape == mask.shape == types.shape == (6, 16)
    assert set(np.unique(mask)) <= {0, 1} and (mask.sum(axis=1) >= 4).all()
    assert set(np.unique(ids[mask == 1])) <= {2, 7, 9} and (ids[mask == 0] == 0).all()
    assert not types.any()
    # each row's mask is a prefix: padding only at the end
    assert all((np.diff(row) <= 0).all() for row in mask)


def test_float_inputs_have_the_configs_fixed_dims() -> None:
    (image,) = tg.make_inputs([tg.TensorSpec("INPUT__0", np.float32, (3, 8, 8))], 2, 16)
    assert image.shape == (2, 3, 8, 8) and image.dtype == np.float32


def test_warmup_ids_come_from_the_exported_sample(tmp_path: Path) -> None:
    model = _model(tmp_path, "enc_ts", ENCODER)
    specs = tg.input_specs(
        {"input": [{"name": "INPUT__0", "data_type": "TYPE_INT64", "dims": [-1]}]}
    )
    assert tg.warmup_ids(model, specs) is None
    (model / "warmup").mkdir()
    np.array([101, 7, 7, 102], dtype=np.int64).tofile(model / "warmup" / "INPUT__0")
    assert tg.warmup_ids(model, specs).tolist() == [7, 101, 102]


def test_error_summary_is_the_line_that_says_what_failed() -> None:
    error = RuntimeError(
        "The following operation failed in the TorchScript interpreter.\n"
        "Traceback of TorchScript (most recent call last):\n  File x\n"
        "RuntimeError: Expected all tensors to be on the same device\n"
    )
    assert tg.error_summary(error) == "RuntimeError: Expected all tensors to be on the same device"
    assert tg.error_summary(ValueError()) == "ValueError"


def test_a_device_failure_fails_the_row() -> None:
    failed = tg.DeviceResult("m", "cuda", None, None, error="RuntimeError: devices")
    passed = tg.DeviceResult("m", "cuda", Parity(1e-6, 0.99999), None)
    low = tg.DeviceResult("m", "cuda", Parity(1e-1, 0.9), None)
    assert not failed.ok(0.999) and "FAIL: RuntimeError: devices" in failed.row(0.999)
    assert passed.ok(0.999) and not low.ok(0.999)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit; a GPU is present")
def test_no_cuda_exits_2_with_what_is_needed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert tg.main(["--model-repository", str(tmp_path)]) == EXIT_NO_GPU
    assert "no CUDA device" in caplog.text


class _Positions(torch.nn.Module):
    """A token model with 4 positions: longer inputs fail, as a real encoder's do."""

    def __init__(self) -> None:
        super().__init__()
        self.positions = torch.nn.Embedding(4, 2)
        self.tokens = torch.nn.Embedding(10, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return (self.tokens(ids) + self.positions.weight[: ids.shape[1]]).sum(dim=1)


def test_a_failing_cpu_reference_is_a_failed_row_naming_the_length(tmp_path: Path) -> None:
    model = _model(
        tmp_path,
        "pos_ts",
        'backend: "pytorch"\nmax_batch_size: 4\n'
        'input { name: "INPUT__0" data_type: TYPE_INT64 dims: -1 }\n'
        'output { name: "OUTPUT__0" data_type: TYPE_FP32 dims: 2 }\n',
    )
    traced = torch.jit.trace(_Positions().eval(), (torch.ones(1, 3, dtype=torch.long),))
    torch.jit.save(traced, str(model / "1" / "model.pt"))
    (row,) = tg.check_model(model, batch=2, seq_len=8, iterations=1)
    assert row.device == "cpu" and not row.ok(0.999)
    assert "--seq-len 8" in row.error
