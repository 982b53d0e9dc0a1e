"""BLS orchestrator: text -> tokenize (here) -> encoder (per-request ``variant``) -> outputs.

One ``execute`` handles all its requests together: decode and validate each (a bad one fails
alone), tokenize every text in one batch, run one encoder call per variant and shape, split back.
Embeddings are returned as the encoder computes them; a classifier's logits are turned into
labels, probabilities and the (per-request ``top_k``) best classes here. With several model
versions, a request pins one (parameter ``version``) or the canary split picks one by request id;
``model_version`` in the response says which answered.
"""

import triton_python_backend_utils as pb_utils

from pathlib import Path

import numpy as np

from tritonforge.bls import (
    build_plan,
    call_encoder,
    plan_encoder_calls,
    request_top_k,
    request_variant,
    request_version,
    split_encoder_output,
)
from tritonforge.classify import classify
from tritonforge.errors import ServingError
from tritonforge.integrity import verify_sidecar
from tritonforge.modelconfig import ModelConfig
from tritonforge.text import TextTokenizer, decode_texts, split_tokens
from tritonforge.triton import encode_response, error_response


class TritonPythonModel:
    def initialize(self, args):
        self.config = ModelConfig.from_json(args["model_config"])
        self.plan = build_plan(self.config, Path(args["model_repository"]).parent)
        settings = self.plan.tokenizer
        verify_sidecar(settings.path, required=True)  # the tokenizer model's file (make export)
        self.tokenizer = TextTokenizer(
            settings.path,
            settings.max_length,
            settings.pad_to_multiple_of,
            outputs=settings.outputs,
            pad_id=settings.pad_id,
        )

    def _decode(self, request):
        params = request.parameters()
        variant = request_variant(params, self.plan)
        top_k = request_top_k(params, self.plan.postprocess) if self.plan.postprocess else 0
        values = pb_utils.get_input_tensor_by_name(request, self.plan.text_input).as_numpy()
        texts = decode_texts(values, self.plan.text_input, self.plan.limits)
        version = request_version(params, request.request_id() or "\n".join(texts), self.plan)
        return (variant, version), top_k, texts

    def _outputs(self, rows, top_k, version):
        post = self.plan.postprocess
        out = {self.plan.output: rows} if post is None else classify(rows, post.labels, top_k)
        if self.plan.version_output:
            out[self.plan.version_output] = np.full((len(rows), 1), version, dtype=np.int32)
        return out

    def execute(self, requests):
        responses = [None] * len(requests)
        by_route = {}
        top_ks = {}
        for i, request in enumerate(requests):
            try:
                key, top_ks[i], texts = self._decode(request)
            except ServingError as e:
                responses[i] = error_response(pb_utils, e, self.config.name)
                continue
            by_route.setdefault(key, []).append((i, texts))
        for (variant, version), members in by_route.items():
            route = self.plan.routes[variant]
            texts = [t for _, ts in members for t in ts]
            parts = split_tokens(
                self.tokenizer.encode(texts),
                [len(ts) for _, ts in members],
                pad_to_multiple_of=self.tokenizer.pad_to_multiple_of,
            )
            indexed = [(i, part) for (i, _), part in zip(members, parts, strict=True)]
            for batch in plan_encoder_calls(indexed, route):
                # One call serves several requests: its trace spans go under the first one's.
                trace = requests[batch.members[0].request_index].trace()
                try:
                    out = call_encoder(
                        pb_utils, route, batch.inputs, self.plan.stage_timeout_ms, trace, version
                    )
                    for i, rows in split_encoder_output(out, batch, route):
                        outputs = self._outputs(rows, top_ks[i], version)
                        responses[i] = encode_response(pb_utils, outputs, self.config)
                except Exception as e:
                    for m in batch.members:
                        responses[m.request_index] = error_response(pb_utils, e, self.config.name)
        return responses
