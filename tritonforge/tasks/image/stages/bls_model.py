"""Image BLS: BYTES images -> the classification outputs, in one Python model: the preprocessing
(its ``image.*`` parameters, as the preprocess stage), one call of the model (``image_model``)
for the request's images, softmax and top-k with ``labels.txt`` (as the postprocess stage).

A request with a bad image is refused (INVALID_ARG, HTTP 400) naming every bad item; the other
requests of the batch are still answered. See config.pbtxt for the names and the bounds.
"""

import triton_python_backend_utils as pb_utils

from pathlib import Path
from typing import Any

from tritonforge.bls import EncoderTarget
from tritonforge.bls_calls import call_encoder
from tritonforge.bls_parameters import request_parameters
from tritonforge.classify import TOP_K_PARAMETER, check_top_k, classify, read_labels
from tritonforge.modelconfig import ModelConfig
from tritonforge.tasks.image.preprocessing import ImagePreprocessing
from tritonforge.tasks.image.transforms import request_pixels
from tritonforge.triton import encode_response, error_response


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        self.config = ModelConfig.from_json(args["model_config"])
        self.spec = ImagePreprocessing.from_parameters(self.config.parameters)
        labels_file = self.config.output("probabilities").label_filename
        self.labels = read_labels(Path(args["model_repository"]) / labels_file)
        self.field = self.config.inputs[0].name
        self.max_items = self.config.param("max_items", max(self.config.max_batch_size, 1), int)
        self.top_k = check_top_k(self.config.param(TOP_K_PARAMETER, 5, int), len(self.labels))
        model_input = self.config.param("model_input", kind=str)
        self.target = EncoderTarget(
            self.config.param("image_model", kind=str),
            {model_input: model_input},
            self.config.param("model_output", kind=str),
        )
        self.timeout_ms = self.config.param("stage_timeout_ms", kind=int)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:  # one request = its images = one model call
            try:
                params = request_parameters(request.parameters())
                top_k = check_top_k(params.get(TOP_K_PARAMETER, self.top_k), len(self.labels))
                tensor = pb_utils.get_input_tensor_by_name(request, self.field)
                items = None if tensor is None else tensor.as_numpy()
                pixels = request_pixels(items, self.field, self.max_items, self.spec)
                (name,) = self.target.inputs
                logits = call_encoder(
                    pb_utils, self.target, {name: pixels}, self.timeout_ms, trace=request.trace()
                )
                outputs = classify(logits, self.labels, top_k)
                responses.append(encode_response(pb_utils, outputs, self.config))
            except Exception as e:  # a ServingError: its code; else INTERNAL
                responses.append(error_response(pb_utils, e, self.config.name))
        return responses
