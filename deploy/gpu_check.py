"""GPU host check: run the exported ONNX encoders with onnxruntime-gpu, compare with the CPU.

For each model (by default every ONNX encoder of every pipeline the repository declares, found by
its ``tritonforge.role``; ``--models`` names others) it runs the graph its ``configs/gpu.pbtxt``
serves (``default_model_filename``: the int8 encoders' static QDQ graph when exported with
``--target gpu``) with each GPU execution provider present (TensorRT at the config's
``precision_mode``, then CUDA) on the same random but valid batch as the CPU provider, and prints
max |diff| and min cosine against the CPU result of that graph, and p50/p95 latency. A model whose
GPU config keeps it on the CPU is skipped with a line saying so. Exit codes: 0 all parity checks
pass, 1 a parity check failed, 2 no GPU execution provider (message says what to install).

    pip install onnxruntime-gpu==1.32.0 numpy==1.26.4   # on the GPU host, instead of onnxruntime
    python -m tritonforge.deploy.gpu_check --model-repository model_repository
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tritonforge.deploy.errors import DeployError

log = logging.getLogger(__name__)
CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
GPU_PROVIDERS = (TENSORRT, CUDA)
# fp16 TensorRT engines move embeddings by ~1e-3; cosine to the CPU result is the contract.
DEFAULT_MIN_COSINE = 0.999
# TensorRT INT8 against ONNX Runtime's CPU run of the same Q/DQ graph (different kernels and
# fusions, same scales); not measured here: no GPU was lent to this project.
DEFAULT_MIN_COSINE_INT8 = 0.99
EXIT_OK, EXIT_PARITY, EXIT_NO_GPU = 0, 1, 2


class GpuCheckError(DeployError):
    """Base of this module's errors."""


class NoGpuProviderError(GpuCheckError):
    """onnxruntime has no GPU execution provider here."""


class ModelMissingError(GpuCheckError):
    """An exported model is not in the model repository."""


def gpu_providers(available: Sequence[str]) -> list[str]:
    """The GPU providers of ``available``, best first; raises when there is none."""
    found = [p for p in GPU_PROVIDERS if p in available]
    if not found:
        raise NoGpuProviderError(
            f"no GPU execution provider in onnxruntime (available: {', '.join(available) or 'none'}). "
            "On a GPU host with the NVIDIA driver, replace onnxruntime with the GPU build: "
            "`pip uninstall -y onnxruntime && pip install onnxruntime-gpu==1.32.0`; "
            "on a machine without a GPU this check cannot run (the CPU path is covered by make test)."
        )
    return found


def provider_options(provider: str, cache_dir: Path, precision: str = "FP16") -> dict[str, Any]:
    """Session options per provider; TensorRT mirrors configs/gpu.pbtxt (its precision_mode,
    engine cache)."""
    if provider == TENSORRT:
        return {
            "trt_fp16_enable": precision == "FP16",
            "trt_int8_enable": precision == "INT8",
            "trt_engine_cache_enable": True,
            "trt_engine_cache_path": str(cache_dir),
        }
    return {}


@dataclass(frozen=True)
class GpuPlan:
    """What ``configs/gpu.pbtxt`` of a model asks for: the file, TensorRT's precision, or none
    (``on_cpu``: the config keeps the model on the host CPU)."""

    file: Path
    precision: str
    on_cpu: bool = False


def gpu_plan(model_dir: Path) -> GpuPlan:
    """The GPU config's served file and precision (``config.pbtxt``'s file, FP16, without one)."""
    from tritonforge.modelconfig import pbtxt_to_dict

    config_path = model_dir / "configs" / "gpu.pbtxt"
    if not config_path.is_file():
        return GpuPlan(model_dir / "1" / "model.onnx", "FP16")
    config = pbtxt_to_dict(config_path.read_text())
    file = model_dir / "1" / str(config.get("default_model_filename") or "model.onnx")
    accelerators = ((config.get("optimization") or {}).get("execution_accelerators") or {}).get(
        "gpu_execution_accelerator"
    ) or []
    trt = next((a for a in accelerators if a.get("name") == "tensorrt"), None)
    kinds = {g.get("kind") for g in config.get("instance_group") or []}
    precision = str(((trt or {}).get("parameters") or {}).get("precision_mode", "FP32"))
    return GpuPlan(file, precision, on_cpu=kinds == {"KIND_CPU"} and not accelerators)


def make_feeds(
    inputs: Sequence[tuple[str, str]], batch: int, seq_len: int, seed: int = 0
) -> dict[str, np.ndarray]:
    """A valid BERT-style batch for ``(name, onnx type)`` inputs: token ids, a padded mask, zeros."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(max(1, seq_len // 4), seq_len + 1, size=batch)
    mask = (np.arange(seq_len)[None, :] < lengths[:, None]).astype(np.int64)
    feeds: dict[str, np.ndarray] = {}
    for name, onnx_type in inputs:
        if onnx_type != "tensor(int64)":
            raise GpuCheckError(f"input {name} is {onnx_type}; this check feeds int64 token inputs")
        if "mask" in name:
            feeds[name] = mask
        elif "type" in name:
            feeds[name] = np.zeros((batch, seq_len), dtype=np.int64)
        else:
            feeds[name] = rng.integers(1000, 20000, size=(batch, seq_len), dtype=np.int64) * mask
    return feeds


@dataclass(frozen=True)
class Parity:
    """How close ``candidate`` is to ``reference`` (rows are embeddings)."""

    max_abs_diff: float
    min_cosine: float

    def ok(self, min_cosine: float = DEFAULT_MIN_COSINE) -> bool:
        return self.min_cosine >= min_cosine


def parity(reference: np.ndarray, candidate: np.ndarray) -> Parity:
    """Max absolute difference and the smallest row-wise cosine similarity."""
    if reference.shape != candidate.shape:
        raise GpuCheckError(
            f"shape mismatch: reference {reference.shape}, candidate {candidate.shape}"
        )
    ref = reference.astype(np.float64).reshape(reference.shape[0], -1)
    cand = candidate.astype(np.float64).reshape(candidate.shape[0], -1)
    norms = np.linalg.norm(ref, axis=1) * np.linalg.norm(cand, axis=1)
    cosine = np.sum(ref * cand, axis=1) / np.maximum(norms, 1e-12)
    return Parity(max_abs_diff=float(np.max(np.abs(ref - cand))), min_cosine=float(np.min(cosine)))


@dataclass(frozen=True)
class Latency:
    p50_ms: float
    p95_ms: float
    iterations: int


def latency(samples_s: Sequence[float]) -> Latency:
    if not samples_s:
        raise GpuCheckError("no latency samples")
    ms = sorted(s * 1e3 for s in samples_s)
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
    return Latency(p50_ms=statistics.median(ms), p95_ms=p95, iterations=len(ms))


@dataclass(frozen=True)
class ProviderResult:
    model: str
    provider: str
    parity: Parity | None
    latency: Latency

    def row(self, min_cosine: float) -> str:
        par = (
            "reference"
            if self.parity is None
            else f"max|diff| {self.parity.max_abs_diff:.2e}  min cos {self.parity.min_cosine:.6f} "
            f"{'ok' if self.parity.ok(min_cosine) else 'FAIL'}"
        )
        return (
            f"{self.model:<16} {self.provider:<28} p50 {self.latency.p50_ms:8.2f} ms  "
            f"p95 {self.latency.p95_ms:8.2f} ms  {par}"
        )


def run_session(
    session: Any, feeds: Mapping[str, np.ndarray], iterations: int
) -> tuple[Any, Latency]:
    """Outputs of ``session`` on ``feeds`` (after 3 warm-up runs) and the latency of ``iterations``."""
    for _ in range(3):
        outputs = session.run(None, dict(feeds))
    samples = []
    for _ in range(iterations):
        start = time.perf_counter()
        outputs = session.run(None, dict(feeds))
        samples.append(time.perf_counter() - start)
    return outputs[0], latency(samples)


def check_model(
    model: Path,
    providers: Sequence[str],
    batch: int,
    seq_len: int,
    iterations: int,
    cache_dir: Path,
    precision: str = "FP16",
) -> list[ProviderResult]:
    """CPU reference, then each provider of ``providers`` on the same batch (TensorRT at
    ``precision``)."""
    import onnxruntime as ort

    if not model.exists():
        raise ModelMissingError(f"{model} does not exist; run `make export` first")
    name = model.parent.parent.name
    results: list[ProviderResult] = []
    reference: np.ndarray | None = None
    feeds: dict[str, np.ndarray] = {}
    for provider in [CPU, *providers]:
        session = ort.InferenceSession(
            str(model),
            providers=[(provider, provider_options(provider, cache_dir, precision))]
            + ([] if provider == CPU else [CPU]),
        )
        if provider != CPU and session.get_providers()[0] != provider:
            raise GpuCheckError(
                f"{provider} was requested but the session runs on {session.get_providers()}"
            )
        if not feeds:
            feeds = make_feeds([(i.name, i.type) for i in session.get_inputs()], batch, seq_len)
        output, lat = run_session(session, feeds, iterations)
        if reference is None:
            reference = np.asarray(output)
            results.append(ProviderResult(name, provider, None, lat))
        else:
            results.append(
                ProviderResult(name, provider, parity(reference, np.asarray(output)), lat)
            )
    return results


def onnx_encoders(repository: Path) -> list[str]:
    """Every pipeline's encoder (``tritonforge.role`` encoder) that is an ONNX file."""
    from tritonforge.deploy.names import roles

    return [
        m
        for m, role in roles(repository).items()
        if role == "encoder" and (repository / m / "1" / "model.onnx").is_file()
    ]


def check_parser(
    description: str, models_help: str, batch: int, seq_len: int, iterations: int
) -> argparse.ArgumentParser:
    """The GPU checks' shared options (repository, models, batch shape, iterations, min cosine)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--models", nargs="+", help=models_help)
    parser.add_argument("--batch", type=int, default=batch)
    parser.add_argument("--seq-len", type=int, default=seq_len)
    parser.add_argument("--iterations", type=int, default=iterations)
    parser.add_argument("--min-cosine", type=float, default=DEFAULT_MIN_COSINE)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = check_parser(
        "ONNX encoders on GPU vs CPU: parity and latency.",
        "default: every ONNX encoder (discovered)",
        batch=32,
        seq_len=128,
        iterations=50,
    )
    parser.add_argument("--min-cosine-int8", type=float, default=DEFAULT_MIN_COSINE_INT8)
    args = parser.parse_args(argv)
    try:
        import onnxruntime as ort
    except ImportError:
        log.error("onnxruntime is not installed; `pip install onnxruntime-gpu==1.32.0`")
        return EXIT_NO_GPU
    try:
        providers = gpu_providers(ort.get_available_providers())
    except NoGpuProviderError as e:
        log.error("gpu_check: %s", e)
        return EXIT_NO_GPU
    failed = False
    models = args.models or onnx_encoders(args.model_repository)
    if not models:
        log.error("gpu_check: no ONNX encoder in %s (make export)", args.model_repository)
        return EXIT_PARITY
    with tempfile.TemporaryDirectory(prefix="trt-cache-") as cache:
        for model in models:
            plan = gpu_plan(args.model_repository / model)
            if plan.on_cpu:
                print(f"{model:<16} skipped: configs/gpu.pbtxt keeps {plan.file.name} on the CPU")
                continue
            bound = args.min_cosine_int8 if plan.precision == "INT8" else args.min_cosine
            try:
                results = check_model(
                    plan.file,
                    providers,
                    args.batch,
                    args.seq_len,
                    args.iterations,
                    Path(cache),
                    plan.precision,
                )
            except GpuCheckError as e:
                log.error("gpu_check: %s: %s", model, e)
                failed = True
                continue
            print(f"{model}: {plan.file.name}, TensorRT {plan.precision}")
            for result in results:
                print(result.row(bound))
                failed |= result.parity is not None and not result.parity.ok(bound)
    return EXIT_PARITY if failed else EXIT_OK


if __name__ == "__main__":
    from tritonforge.logs import run_main

    raise SystemExit(run_main(main))
