"""Image postprocess stage: logits -> softmax, label, score, probabilities, top-k labels.

The labels are the ``label_filename`` of the ``probabilities`` output (so Triton's classification
extension names them too); top-k is ``parameters.top_k`` or a request's ``top_k`` parameter (1 to
the number of labels). The body is :func:`tritonforge.classify.classify`.
"""

import triton_python_backend_utils as pb_utils

from pathlib import Path
from typing import Any

from tritonforge.bls_parameters import request_parameters
from tritonforge.classify import TOP_K_PARAMETER, check_top_k, classify, read_labels
from tritonforge.errors import InvalidInputError
from tritonforge.modelconfig import ModelConfig
from tritonforge.triton import encode_response, error_response


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        self.config = ModelConfig.from_json(args["model_config"])
        labels_file = self.config.output("probabilities").label_filename
        self.labels = read_labels(Path(args["model_repository"]) / labels_file)
        self.field = self.config.inputs[0].name
        self.top_k = check_top_k(self.config.param(TOP_K_PARAMETER, 5, int), len(self.labels))

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                params = request_parameters(request.parameters())
                top_k = check_top_k(params.get(TOP_K_PARAMETER, self.top_k), len(self.labels))
                tensor = pb_utils.get_input_tensor_by_name(request, self.field)
                if tensor is None:
                    raise InvalidInputError(f"input {self.field!r} is required")
                outputs = classify(tensor.as_numpy(), self.labels, top_k)
                responses.append(encode_response(pb_utils, outputs, self.config))
            except Exception as e:
                responses.append(error_response(pb_utils, e, self.config.name))
        return responses
