"""Python-based ``onnxruntime`` backend for the embedded server.

Serves every model whose config says ``backend: "onnxruntime"`` (the NVIDIA container's native
backend serves the same config). Reads everything from the config: ``default_model_filename``,
tensor names/dtypes, ``max_batch_size``, ``parameters.intra_op_thread_count`` /
``inter_op_thread_count`` (the native backend's keys), ONNX Runtime session config entries
(parameters whose key starts with ``session.``) and ``pad_values``.

``parameters.batch_rows`` (``auto``, the default; ``together``; ``alone``): ``alone`` runs each
row of a merged batch by itself, cut to its unpadded length (:func:`tritonforge.batching.infer_rows`),
so that a request's answer does not depend on who shares its batch. ``auto`` does that when the
graph quantizes activations with one scale per tensor at run time (``DynamicQuantizeLinear``:
dynamic int8), where batching and padding would change every row's scale. Otherwise the merged
batch runs cut to its longest row (:func:`tritonforge.batching.infer_trimmed`): the padding every
row shares is not computed.
"""

import triton_python_backend_utils as pb_utils

import json
from pathlib import Path

import onnxruntime as ort

from tritonforge.batching import infer_rows, infer_trimmed, rows_alone
from tritonforge.integrity import verify_sidecar
from tritonforge.modelconfig import ModelConfig
from tritonforge.ort_options import session_options
from tritonforge.triton import execute_batched, pad_values_from


class TritonPythonModel:
    def initialize(self, args):
        self.config = ModelConfig.from_json(args["model_config"])
        version_dir = Path(args["model_repository"]) / args["model_version"]
        path = version_dir / (self.config.default_model_filename or "model.onnx")
        verify_sidecar(path, required=True)
        # thread counts and session.* entries (spinning off, ...) from the config's parameters
        options = session_options(ort, self.config.parameters)
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.output_names = [o.name for o in self.config.outputs]
        # Symbolic dims (dim_param) name the axes: outputs are unpadded along the inputs' names.
        self.axis_names = {
            t.name: [d if isinstance(d, str) else None for d in t.shape]
            for t in [*self.session.get_inputs(), *self.session.get_outputs()]
        }
        self.pad_values = pad_values_from(self.config)
        self.graph_inputs = {t.name for t in self.session.get_inputs()}
        self.rows_alone = rows_alone(path, self.config.param("batch_rows", "auto"))
        pb_utils.Logger.log_info(
            f"{self.config.name}: {path.name} on onnxruntime {ort.__version__} "
            f"{json.dumps(self.axis_names)}; rows {'alone' if self.rows_alone else 'batched'}"
        )

    def _run(self, feed):
        return dict(zip(self.output_names, self.session.run(self.output_names, feed), strict=True))

    def _infer(self, inputs):
        feed = {k: v for k, v in inputs.items() if k in self.graph_inputs}
        if self.rows_alone:
            return infer_rows(feed, self._run, self.pad_values, self.axis_names)
        return infer_trimmed(feed, self._run, self.pad_values, self.axis_names)

    def execute(self, requests):
        return execute_batched(
            pb_utils, requests, self.config, self._infer, self.pad_values, self.axis_names
        )
