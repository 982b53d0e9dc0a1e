"""Python-based ``pytorch`` (TorchScript) backend for the embedded server.

Same contract as the NVIDIA container's native PyTorch backend: ``default_model_filename``
(``model.pt``), inputs ``INPUT__<i>`` passed positionally by index, outputs ``OUTPUT__<i>``,
``parameters.INTRA_OP_THREAD_COUNT`` / ``INTER_OP_THREAD_COUNT`` / ``DISABLE_OPTIMIZED_EXECUTION`` /
``ENABLE_JIT_PROFILING`` / ``ENABLE_JIT_EXECUTOR``. ``parameters.pad_values`` and
``parameters.axis_names`` say which axes may be padded when batching requests of different shapes.
"""

import triton_python_backend_utils as pb_utils

import re
from pathlib import Path

import torch

from tritonforge.errors import ModelConfigError
from tritonforge.integrity import verify_sidecar
from tritonforge.modelconfig import ModelConfig
from tritonforge.triton import execute_batched, pad_values_from, parse_axis_names

_INDEXED = re.compile(r"__(\d+)$")


def _index(name):
    m = _INDEXED.search(name)
    if not m:
        raise ModelConfigError(f"tensor {name!r} must follow the INPUT__<i>/OUTPUT__<i> convention")
    return int(m.group(1))


class TritonPythonModel:
    def initialize(self, args):
        self.config = ModelConfig.from_json(args["model_config"])
        version_dir = Path(args["model_repository"]) / args["model_version"]
        path = version_dir / (self.config.default_model_filename or "model.pt")
        verify_sidecar(path, required=True)
        intra = self.config.param("INTRA_OP_THREAD_COUNT", 0, int)
        if intra > 0:
            torch.set_num_threads(intra)
        self.module = torch.jit.load(str(path), map_location="cpu").eval()
        # The native backend's switches: optimized execution (the profiling executor caches a
        # specialised graph per input shape) and the JIT executor/profiling modes.
        self.optimized = not self.config.param("DISABLE_OPTIMIZED_EXECUTION", False, bool)
        if "ENABLE_JIT_PROFILING" in self.config.parameters:
            torch._C._jit_set_profiling_mode(self.config.param("ENABLE_JIT_PROFILING", True, bool))
        if "ENABLE_JIT_EXECUTOR" in self.config.parameters:
            torch._C._jit_set_profiling_executor(
                self.config.param("ENABLE_JIT_EXECUTOR", True, bool)
            )
        self.input_order = sorted((s.name for s in self.config.inputs), key=_index)
        self.output_order = sorted((s.name for s in self.config.outputs), key=_index)
        self.pad_values = pad_values_from(self.config)
        self.axis_names = parse_axis_names(self.config.parameters.get("axis_names", ""))

    def _infer(self, inputs):
        with torch.inference_mode(), torch.jit.optimized_execution(self.optimized):
            result = self.module(*(torch.from_numpy(inputs[n]) for n in self.input_order))
        if isinstance(result, torch.Tensor):
            result = (result,)
        return {name: t.numpy() for name, t in zip(self.output_order, result, strict=True)}

    def execute(self, requests):
        return execute_batched(
            pb_utils, requests, self.config, self._infer, self.pad_values, self.axis_names
        )
