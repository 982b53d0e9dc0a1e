"""GPU host check for the TorchScript models: the same ``model.pt`` on CUDA vs on the CPU.

NVIDIA's container serves ``backend: "pytorch"`` models with its native PyTorch backend, on the
GPU when the model's ``configs/gpu.pbtxt`` (or an operator's edit) says ``KIND_GPU``. A module
traced on the CPU can still be tied to it (a tensor created with ``device="cpu"`` inside
``forward`` is frozen into the trace), which only shows on a GPU. For each TorchScript model of
the repository (``backend: "pytorch"`` in its ``config.pbtxt``; ``--models`` names others) this
loads the file with ``map_location="cuda"``, feeds the same valid batch built from the config
(token ids for integer inputs, a padded mask for a ``*mask*``-named one, standard normal values
for float inputs, every ``-1`` axis at ``--seq-len``) to the CPU and the CUDA module, and prints
max |diff|, min cosine and p50/p95 latency. Exit codes: 0 every model passes, 1 a model fails
(a device error or parity below ``--min-cosine``), 2 torch sees no CUDA device.

    python -m tritonforge.deploy.torchscript_gpu --model-repository model_repository
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tritonforge.deploy.gpu_check import (
    EXIT_NO_GPU,
    EXIT_OK,
    EXIT_PARITY,
    GpuCheckError,
    Latency,
    Parity,
    check_parser,
    latency,
    parity,
)

log = logging.getLogger(__name__)
TORCH_DTYPES = {
    "TYPE_INT64": np.int64,
    "TYPE_INT32": np.int32,
    "TYPE_FP32": np.float32,
    "TYPE_FP16": np.float16,
}


@dataclass(frozen=True)
class TensorSpec:
    """One input of a model config: its name, numpy dtype and dims (without the batch axis)."""

    name: str
    dtype: Any
    dims: tuple[int, ...]


def torchscript_models(repository: Path) -> list[str]:
    """Every model of ``repository`` whose config serves it with the ``pytorch`` backend."""
    from tritonforge.modelconfig import pbtxt_to_dict

    found = []
    for config in sorted(repository.glob("*/config.pbtxt")):
        parsed = pbtxt_to_dict(config.read_text())
        if parsed.get("backend") == "pytorch" or parsed.get("platform") == "pytorch_libtorch":
            found.append(config.parent.name)
    return found


def input_specs(config: Mapping[str, Any]) -> list[TensorSpec]:
    """The inputs of a parsed ``config.pbtxt``, in ``INPUT__<i>`` order (the backend's contract)."""
    specs = []
    for entry in config.get("input") or []:
        data_type = str(entry.get("data_type"))
        if data_type not in TORCH_DTYPES:
            raise GpuCheckError(f"input {entry.get('name')}: {data_type} is not fed by this check")
        dims = tuple(int(d) for d in entry.get("dims") or [])
        specs.append(TensorSpec(str(entry["name"]), TORCH_DTYPES[data_type], dims))
    return sorted(specs, key=lambda s: int(s.name.rsplit("__", 1)[-1]))


def warmup_ids(model_dir: Path, specs: Sequence[TensorSpec]) -> np.ndarray | None:
    """The token ids of the model's warmup sample (``warmup/<first input>``, written by the
    export from a real text), or None: valid ids for any vocabulary size."""
    if not specs or not np.issubdtype(specs[0].dtype, np.integer):
        return None
    path = model_dir / "warmup" / specs[0].name
    if not path.is_file():
        return None
    ids = np.unique(np.fromfile(path, dtype=specs[0].dtype))
    return ids if ids.size else None


def make_inputs(
    specs: Sequence[TensorSpec],
    batch: int,
    seq_len: int,
    vocab_ids: np.ndarray | None = None,
    seed: int = 0,
) -> list[np.ndarray]:
    """A valid batch for ``specs``: ``-1`` axes at ``seq_len``; the first integer input holds token
    ids drawn from ``vocab_ids`` (default ``[1, 100)``; zero past each row's length), the second a
    padded 0/1 mask (BERT-family order: ids, mask, token types), the third zeros; float inputs
    standard normal."""
    if vocab_ids is None:
        vocab_ids = np.arange(1, 100)
    rng = np.random.default_rng(seed)
    lengths = rng.integers(max(1, seq_len // 4), seq_len + 1, size=batch)
    arrays: list[np.ndarray] = []
    int_index = 0
    for spec in specs:
        shape = (batch, *(seq_len if d < 0 else d for d in spec.dims))
        if np.issubdtype(spec.dtype, np.integer):
            mask = (np.arange(shape[-1])[None, :] < lengths[:, None]).astype(spec.dtype)
            if int_index == 0:
                arrays.append((rng.choice(vocab_ids, size=shape) * mask).astype(spec.dtype))
            elif int_index == 1:
                arrays.append(mask)
            else:
                arrays.append(np.zeros(shape, dtype=spec.dtype))
            int_index += 1
        else:
            arrays.append(rng.standard_normal(shape).astype(spec.dtype))
    return arrays


@dataclass(frozen=True)
class DeviceResult:
    model: str
    device: str
    parity: Parity | None
    latency: Latency | None
    error: str = ""

    def ok(self, min_cosine: float) -> bool:
        return not self.error and (self.parity is None or self.parity.ok(min_cosine))

    def row(self, min_cosine: float) -> str:
        if self.error:
            return f"{self.model:<32} {self.device:<5} FAIL: {self.error}"
        lat = self.latency
        timing = f"p50 {lat.p50_ms:8.2f} ms  p95 {lat.p95_ms:8.2f} ms" if lat else ""
        par = (
            "reference"
            if self.parity is None
            else f"max|diff| {self.parity.max_abs_diff:.2e}  min cos {self.parity.min_cosine:.6f} "
            f"{'ok' if self.parity.ok(min_cosine) else 'FAIL'}"
        )
        return f"{self.model:<32} {self.device:<5} {timing}  {par}"


def error_summary(error: BaseException) -> str:
    """The line of a (TorchScript) error that says what failed: its last non-empty line (the
    interpreter's traceback comes first), or the error's type."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


def _run(
    module: Any, tensors: Sequence[Any], iterations: int, sync: Any, optimized: bool
) -> tuple[Any, Latency]:
    import torch

    with torch.inference_mode(), torch.jit.optimized_execution(optimized):
        for _ in range(3):
            out = module(*tensors)
        sync()
        samples = []
        for _ in range(iterations):
            start = time.perf_counter()
            out = module(*tensors)
            sync()
            samples.append(time.perf_counter() - start)
    first = out[0] if isinstance(out, (tuple, list)) else out
    return first.float().cpu().numpy(), latency(samples)


def check_model(model_dir: Path, batch: int, seq_len: int, iterations: int) -> list[DeviceResult]:
    """CPU reference, then CUDA, for the TorchScript model in ``model_dir``."""
    import torch

    from tritonforge.modelconfig import pbtxt_to_dict

    config = pbtxt_to_dict((model_dir / "config.pbtxt").read_text())
    path = model_dir / "1" / str(config.get("default_model_filename") or "model.pt")
    if not path.is_file():
        raise GpuCheckError(f"{path} does not exist; run `make export` first")
    specs = input_specs(config)
    arrays = make_inputs(specs, batch, seq_len, warmup_ids(model_dir, specs))
    name = model_dir.name
    # As the backend runs it: the config's DISABLE_OPTIMIZED_EXECUTION switch.
    params = config.get("parameters") or {}
    disabled = str((params.get("DISABLE_OPTIMIZED_EXECUTION") or {}).get("string_value", "false"))
    optimized = disabled.lower() != "true"
    cpu = torch.jit.load(str(path), map_location="cpu").eval()
    try:
        reference, cpu_latency = _run(
            cpu, [torch.from_numpy(a) for a in arrays], iterations, lambda: None, optimized
        )
    except (RuntimeError, torch.jit.Error) as e:  # e.g. --seq-len past the model's positions
        hint = f" (the CPU reference failed: is --seq-len {seq_len} within the model's length?)"
        return [DeviceResult(name, "cpu", None, None, error=error_summary(e) + hint)]
    results = [DeviceResult(name, "cpu", None, cpu_latency)]
    try:
        gpu = torch.jit.load(str(path), map_location="cuda").eval()
        output, gpu_latency = _run(
            gpu,
            [torch.from_numpy(a).cuda() for a in arrays],
            iterations,
            torch.cuda.synchronize,
            optimized,
        )
    except (RuntimeError, torch.jit.Error) as e:  # a device tied into the trace shows here
        return [*results, DeviceResult(name, "cuda", None, None, error=error_summary(e))]
    return [*results, DeviceResult(name, "cuda", parity(reference, output), gpu_latency)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = check_parser(
        "TorchScript models on CUDA vs CPU: parity.",
        "default: every pytorch-backend model",
        batch=8,
        seq_len=64,
        iterations=20,
    )
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        log.error("torch_gpu: torch sees no CUDA device (a CUDA build of torch on a GPU host)")
        return EXIT_NO_GPU
    models = args.models or torchscript_models(args.model_repository)
    if not models:
        log.error("torch_gpu: no TorchScript model in %s (make export)", args.model_repository)
        return EXIT_PARITY
    failed = False
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    for model in models:
        try:
            results = check_model(
                args.model_repository / model, args.batch, args.seq_len, args.iterations
            )
        except GpuCheckError as e:
            log.error("torch_gpu: %s: %s", model, e)
            failed = True
            continue
        for result in results:
            print(result.row(args.min_cosine))
            failed |= not result.ok(args.min_cosine)
    return EXIT_PARITY if failed else EXIT_OK


if __name__ == "__main__":
    from tritonforge.logs import run_main

    raise SystemExit(run_main(main))
