"""Image preprocess stage: BYTES encoded images -> the model's float32 pixels (see config.pbtxt).

The preprocessing is the config's ``image.*`` parameters (:class:`ImagePreprocessing`, written
from the task's spec). Each row of a request is one image; a request with a bad image is refused
with INVALID_ARG (HTTP 400) naming every bad item, and the other requests of the batch are still
answered. ``parameters.max_items`` bounds the images of one request (default: max_batch_size).
"""

import triton_python_backend_utils as pb_utils

from typing import Any

from tritonforge.modelconfig import ModelConfig
from tritonforge.tasks.image.preprocessing import ImagePreprocessing
from tritonforge.tasks.image.transforms import request_pixels
from tritonforge.triton import encode_response, error_response


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        self.config = ModelConfig.from_json(args["model_config"])
        self.spec = ImagePreprocessing.from_parameters(self.config.parameters)
        self.field = self.config.inputs[0].name
        self.output = self.config.outputs[0].name
        self.max_items = self.config.param("max_items", max(self.config.max_batch_size, 1), int)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                tensor = pb_utils.get_input_tensor_by_name(request, self.field)
                items = None if tensor is None else tensor.as_numpy()
                pixels = request_pixels(items, self.field, self.max_items, self.spec)
                responses.append(encode_response(pb_utils, {self.output: pixels}, self.config))
            except Exception as e:
                responses.append(error_response(pb_utils, e, self.config.name))
        return responses
