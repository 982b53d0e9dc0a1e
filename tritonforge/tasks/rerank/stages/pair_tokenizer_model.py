"""Rerank pair tokenizer stage: BYTES query [1] + documents [n] -> the encoder's int64 inputs
[n, longest pair] (see config.pbtxt; names and limits in its ``parameters``)."""

import triton_python_backend_utils as pb_utils

from pathlib import Path
from typing import Any

from tritonforge.integrity import verify_sidecar
from tritonforge.modelconfig import ModelConfig
from tritonforge.tasks.rerank.pairs import PairTokenizer
from tritonforge.tasks.rerank.tensors import decode_pairs, pair_stage
from tritonforge.triton import decode_request, encode_response, error_response


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        self.config = ModelConfig.from_json(args["model_config"])
        self.stage = pair_stage(self.config)
        path = Path(args["model_repository"]) / args["model_version"] / self.stage.tokenizer_file
        verify_sidecar(path, required=True)  # written by the export; missing/mismatch: no load
        self.tokenizer = PairTokenizer(
            path, self.stage.max_length, self.stage.truncation, outputs=self.stage.outputs
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:  # one request = one query's documents, one batch
            try:
                inputs = decode_request(pb_utils, request, self.config)
                query, documents = decode_pairs(inputs, self.stage)
                tokens = self.tokenizer.encode(query, documents)
                responses.append(encode_response(pb_utils, tokens, self.config))
            except Exception as e:  # answered INTERNAL, traceback logged
                responses.append(error_response(pb_utils, e, self.config.name))
        return responses
