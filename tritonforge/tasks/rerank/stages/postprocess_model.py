"""Rerank postprocess stage: the encoder's logits [n, 1] -> ``logits`` and ``scores`` (sigmoid)
in document order and ``ranking`` (document indices, best first, cut to the request's ``top_n``
parameter); see config.pbtxt."""

import triton_python_backend_utils as pb_utils

from typing import Any

from tritonforge.modelconfig import ModelConfig
from tritonforge.tasks.rerank.scores import postprocess
from tritonforge.tasks.rerank.tensors import request_top_n
from tritonforge.triton import encode_response, error_response


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        self.config = ModelConfig.from_json(args["model_config"])
        self.field = self.config.inputs[0].name
        self.top_n_parameter = self.config.param("top_n_parameter", kind=str)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:  # top_n is per request (an ensemble forwards its parameters)
            try:
                logits = pb_utils.get_input_tensor_by_name(request, self.field).as_numpy()
                top_n = request_top_n(request.parameters(), self.top_n_parameter, len(logits))
                outputs = postprocess(logits, top_n)
                responses.append(encode_response(pb_utils, outputs, self.config))
            except Exception as e:  # a ServingError: its code; else INTERNAL
                responses.append(error_response(pb_utils, e, self.config.name))
        return responses
