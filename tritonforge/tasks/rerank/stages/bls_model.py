"""Rerank BLS: BYTES query [1] + documents [n] -> ``scores``, ``logits`` (document order) and
``ranking`` (best first, cut to the request's ``top_n`` parameter), the N documents of one query
tokenized in-process and scored by the encoder in one call (see config.pbtxt: the encoder's name,
inputs and output and the limits are its ``parameters``)."""

import triton_python_backend_utils as pb_utils

import dataclasses
from pathlib import Path
from typing import Any

from tritonforge.bls import EncoderTarget
from tritonforge.bls_calls import call_encoder
from tritonforge.integrity import verify_sidecar
from tritonforge.modelconfig import ModelConfig
from tritonforge.tasks.rerank.pairs import PairTokenizer
from tritonforge.tasks.rerank.scores import postprocess
from tritonforge.tasks.rerank.tensors import decode_pairs, pair_stage, request_top_n
from tritonforge.triton import decode_request, encode_response, error_response


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        self.config = ModelConfig.from_json(args["model_config"])
        tokens = tuple(self.config.param("encoder_inputs", kind=str).split(","))
        self.stage = dataclasses.replace(pair_stage(self.config), outputs=tokens)
        path = Path(args["model_repository"]) / args["model_version"] / self.stage.tokenizer_file
        verify_sidecar(path, required=True)  # written by the export; missing/mismatch: no load
        self.tokenizer = PairTokenizer(
            path, self.stage.max_length, self.stage.truncation, outputs=tokens
        )
        self.target = EncoderTarget(
            self.config.param("score_model", kind=str),
            {n: n for n in tokens},
            self.config.param("encoder_output", kind=str),
        )
        self.timeout_ms = self.config.param("stage_timeout_ms", kind=int)
        self.top_n_parameter = self.config.param("top_n_parameter", kind=str)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:  # one request = one query's documents = one encoder call
            try:
                inputs = decode_request(pb_utils, request, self.config)
                query, documents = decode_pairs(inputs, self.stage)
                feed = self.tokenizer.encode(query, documents)
                logits = call_encoder(
                    pb_utils, self.target, feed, self.timeout_ms, trace=request.trace()
                )
                top_n = request_top_n(request.parameters(), self.top_n_parameter, len(documents))
                outputs = postprocess(logits, top_n)
                responses.append(encode_response(pb_utils, outputs, self.config))
            except Exception as e:  # a ServingError: its code; else INTERNAL
                responses.append(error_response(pb_utils, e, self.config.name))
        return responses
