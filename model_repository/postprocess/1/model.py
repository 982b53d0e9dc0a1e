"""Postprocess stage: mean-pooled ``sentence_embedding`` -> unit-L2 ``embedding``."""

import triton_python_backend_utils as pb_utils

import numpy as np

from tritonforge.batching import validate_inputs
from tritonforge.errors import NumericalError, ServingError
from tritonforge.modelconfig import ModelConfig
from tritonforge.text import l2_normalize_rows
from tritonforge.triton import decode_request, encode_response, error_response


class TritonPythonModel:
    def initialize(self, args):
        self.config = ModelConfig.from_json(args["model_config"])
        self.input_name = self.config.inputs[0].name
        self.output_name = self.config.outputs[0].name

    def execute(self, requests):
        responses = [None] * len(requests)
        rows, members = [], []
        for i, request in enumerate(requests):
            try:
                inputs = validate_inputs(
                    self.config, decode_request(pb_utils, request, self.config)
                )
            except ServingError as e:
                responses[i] = error_response(pb_utils, e, self.config.name)
                continue
            rows.append(inputs[self.input_name])
            members.append(i)
        if not members:
            return responses
        normalized, bad = l2_normalize_rows(np.concatenate(rows))  # one vectorised pass
        start = 0
        for i, part in zip(members, rows, strict=True):
            stop = start + len(part)
            if bad[start:stop].any():
                err = NumericalError(f"{self.input_name!r} has NaN/Inf rows (encoder output)")
                responses[i] = error_response(pb_utils, err, self.config.name)
            else:
                out = {self.output_name: normalized[start:stop]}
                responses[i] = encode_response(pb_utils, out, self.config)
            start = stop
        return responses
