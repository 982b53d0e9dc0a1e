"""Classification postprocess stage: logits -> label, score, probabilities, top-k (config.pbtxt).

The labels are the ``label_filename`` of the ``probabilities`` output (so Triton's classification
extension, ``class_count``, names them too); the top-k size is ``parameters.top_k``, or a
request's ``top_k`` parameter (1 to the number of labels; an ensemble forwards its parameters).
"""

import triton_python_backend_utils as pb_utils

from pathlib import Path

from tritonforge.bls import Postprocess
from tritonforge.bls_parameters import request_top_k
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
        self.post = Postprocess(self.config.name, self.labels, self.config.param("top_k", 1, int))

    def execute(self, requests):
        responses = []
        for request in requests:  # top_k is per request (an ensemble forwards its parameters)
            try:
                top_k = request_top_k(request.parameters(), self.post)
                logits = pb_utils.get_input_tensor_by_name(request, self.field).as_numpy()
                outputs = classify(logits, self.labels, top_k)
                responses.append(encode_response(pb_utils, outputs, self.config))
            except Exception as e:
                responses.append(error_response(pb_utils, e, self.config.name))
        return responses
