"""BLS orchestrator: text -> tokenize (here) -> encoder (per-request ``variant``) -> outputs.

One ``execute`` handles all its requests together: decode and validate each (a bad one fails
alone), tokenize every text in one batch, run one encoder call per variant and shape, split back.
Embeddings are returned as the encoder computes them; a classifier's logits are turned into
labels, probabilities and the (per-request ``top_k``) best classes here. With several model
versions, a request pins one (parameter ``version``) or the canary split picks one by request id;
``model_version`` in the response says which answered. When the instance is overloaded (or the
default encoder refuses a call), requests that allow it are answered by their ``fallback``
variant (docs/reliability.md); ``variant`` in the response says which answered.
"""

import triton_python_backend_utils as pb_utils

from pathlib import Path

import numpy as np

from tritonforge.bls import build_plan
from tritonforge.bls_calls import call_encoder, plan_encoder_calls, split_encoder_output
from tritonforge.bls_degrade import LoadMonitor, degraded_counter, refused
from tritonforge.bls_parameters import (
    request_fallback,
    request_top_k,
    request_variant,
    request_version,
)
from tritonforge.classify import classify
from tritonforge.errors import ServingError
from tritonforge.integrity import verify_sidecar
from tritonforge.modelconfig import ModelConfig
from tritonforge.pipelines import PIPELINE_KEY
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
        self.monitor = LoadMonitor(self.plan.degrade)
        pipeline = self.config.param(PIPELINE_KEY, self.config.name, str)
        self.count_degraded = degraded_counter(pb_utils, pipeline, self.config.name)

    def _decode(self, request):
        params = request.parameters()
        variant = request_variant(params, self.plan)
        top_k = request_top_k(params, self.plan.postprocess) if self.plan.postprocess else 0
        values = pb_utils.get_input_tensor_by_name(request, self.plan.text_input).as_numpy()
        texts = decode_texts(values, self.plan.text_input, self.plan.limits)
        version = request_version(params, request.request_id() or "\n".join(texts), self.plan)
        fallback = request_fallback(params, variant, self.plan)
        return (variant, version, fallback), top_k, texts

    def _outputs(self, rows, top_k, version, variant):
        post = self.plan.postprocess
        out = {self.plan.output: rows} if post is None else classify(rows, post.labels, top_k)
        if self.plan.version_output:
            out[self.plan.version_output] = np.full((len(rows), 1), version, dtype=np.int32)
        if self.plan.variant_output:
            out[self.plan.variant_output] = np.full((len(rows), 1), variant.encode(), np.object_)
        return out

    def execute(self, requests):
        overloaded = self.monitor.start(len(requests))
        try:
            return self._execute(requests, overloaded)
        finally:
            self.monitor.end()

    def _run(self, encoder, batch, version, requests):
        # One call serves several requests: its trace spans go under the first one's.
        trace = requests[batch.members[0].request_index].trace()
        return call_encoder(
            pb_utils, encoder, batch.inputs, self.plan.stage_timeout_ms, trace, version
        )

    def _execute(self, requests, overloaded):
        responses = [None] * len(requests)
        by_choice = {}
        top_ks = {}
        for i, request in enumerate(requests):
            try:
                key, top_ks[i], texts = self._decode(request)
            except ServingError as e:
                responses[i] = error_response(pb_utils, e, self.config.name)
                continue
            by_choice.setdefault(key, []).append((i, texts))
        for (requested, version, fallback), members in by_choice.items():
            variant = requested
            if fallback is not None and overloaded:
                variant, fallback = fallback, None
            encoder = self.plan.encoders[variant]
            texts = [t for _, ts in members for t in ts]
            parts = split_tokens(
                self.tokenizer.encode(texts),
                [len(ts) for _, ts in members],
                pad_to_multiple_of=self.tokenizer.pad_to_multiple_of,
            )
            indexed = [(i, part) for (i, _), part in zip(members, parts, strict=True)]
            for batch in plan_encoder_calls(indexed, encoder):
                answered, used = encoder, variant
                try:
                    try:
                        out = self._run(encoder, batch, version, requests)
                    except Exception as e:
                        spare = self.plan.encoders.get(fallback or "")
                        if spare is None or spare.inputs != encoder.inputs or not refused(e):
                            raise
                        # the default encoder refused (queue full / timed out): degrade
                        answered, used = spare, fallback
                        out = self._run(answered, batch, version, requests)
                    if used != requested:
                        self.count_degraded(used, len(batch.members))
                    for i, rows in split_encoder_output(out, batch, answered):
                        outputs = self._outputs(rows, top_ks[i], version, used)
                        responses[i] = encode_response(pb_utils, outputs, self.config)
                except Exception as e:
                    for m in batch.members:
                        responses[m.request_index] = error_response(pb_utils, e, self.config.name)
        return responses
