"""Classification postprocess stage: logits -> label, score, probabilities, top-k (config.pbtxt).

The labels are the ``label_filename`` of the ``probabilities`` output (so Triton's classification
extension, ``class_count``, names them too); the top-k size is ``parameters.top_k``.
"""

import triton_python_backend_utils as pb_utils

from pathlib import Path

import numpy as np

from tritonforge.classify import classify, read_labels
from tritonforge.modelconfig import ModelConfig
from tritonforge.triton import encode_response, error_response


class TritonPythonModel:
    def initialize(self, args):
        self.config = ModelConfig.from_json(args["model_config"])
        model_dir = Path(args["model_repository"])
        self.field = self.config.inputs[0].name
        probabilities = self.config.output("probabilities")
        self.labels = read_labels(model_dir / probabilities.label_filename)
        self.top_k = self.config.param("top_k", 1, int)

    def execute(self, requests):
        logits = [pb_utils.get_input_tensor_by_name(r, self.field).as_numpy() for r in requests]
        counts = [len(x) for x in logits]
        try:
            outputs = classify(np.concatenate(logits), self.labels, self.top_k)
        except Exception as e:
            return [error_response(pb_utils, e, self.config.name) for _ in requests]
        responses, start = [], 0
        for n in counts:
            part = {k: v[start : start + n] for k, v in outputs.items()}
            responses.append(encode_response(pb_utils, part, self.config))
            start += n
        return responses
