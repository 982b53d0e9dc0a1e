"""BLS orchestrator: text -> tokenize (here) -> encoder (per-request ``variant``) -> outputs.

One ``execute`` handles all its requests together: decode and validate each (a bad one fails
alone), tokenize the texts of each variant in one batch, make one encoder call per variant and
shape, the calls concurrently (as many at once as the encoder has instances), and answer each
call's requests as soon as that call is done (response senders; ``execute`` returns None).
Embeddings are returned as the encoder computes them; a classifier's logits are turned into
labels, probabilities and the (per-request ``top_k``) best classes here. With several model
versions, a request pins one (parameter ``version``) or the canary split picks one by request id;
``model_version`` in the response says which answered. When the instance is overloaded (or the
default encoder refuses a call), requests that allow it are answered by their ``fallback``
variant (docs/reliability.md); ``variant`` in the response says which answered.
"""

import triton_python_backend_utils as pb_utils

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from tritonforge.bls import build_plan
from tritonforge.bls_calls import (
    EncoderCall,
    call_encoder,
    plan_encoder_calls,
    run_calls,
    split_encoder_output,
)
from tritonforge.bls_degrade import LoadMonitor, degraded_counter
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
from tritonforge.triton import Answers, encode_response, error_response


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
        workers = self.plan.max_concurrent_calls
        self.pool = ThreadPoolExecutor(workers, "bls-call") if workers > 1 else None

    def finalize(self):
        if self.pool is not None:
            self.pool.shutdown(wait=True)

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
        answers = Answers(pb_utils, requests)
        try:
            self._execute(requests, overloaded, answers)
        except Exception as e:  # every request still gets its one answer
            answers.fail_pending(lambda e=e: error_response(pb_utils, e, self.config.name))
        finally:
            self.monitor.end()
        return None

    def _run(self, requests):
        def run(call, encoder):
            # One call serves several requests: its trace spans go under the first one's.
            trace = requests[call.batch.members[0].request_index].trace()
            timeout_ms = self.plan.stage_timeout_ms
            inputs = call.batch.inputs
            return call_encoder(pb_utils, encoder, inputs, timeout_ms, trace, call.version)

        return run

    def _calls(self, members, requested, version, fallback, overloaded):
        variant, spare = requested, fallback
        if fallback is not None and overloaded:
            variant, spare = fallback, None
        texts = [t for _, ts in members for t in ts]
        parts = split_tokens(
            self.tokenizer.encode(texts),
            [len(ts) for _, ts in members],
            pad_to_multiple_of=self.tokenizer.pad_to_multiple_of,
        )
        indexed = [(i, part) for (i, _), part in zip(members, parts, strict=True)]
        batches = plan_encoder_calls(indexed, self.plan.encoders[variant])
        return [EncoderCall(b, requested, variant, version, spare) for b in batches]

    def _answer(self, done, top_ks, answers):
        members = [m.request_index for m in done.call.batch.members]
        try:
            if done.error is not None:
                raise done.error
            if done.degraded:
                self.count_degraded(done.variant, len(members))
            encoder = self.plan.encoders[done.variant]
            for i, rows in split_encoder_output(done.output, done.call.batch, encoder):
                outputs = self._outputs(rows, top_ks[i], done.call.version, done.variant)
                answers.send(i, encode_response(pb_utils, outputs, self.config))
        except Exception as e:
            for i in members:
                answers.send(i, error_response(pb_utils, e, self.config.name))

    def _execute(self, requests, overloaded, answers):
        by_choice = {}
        top_ks = {}
        for i, request in enumerate(requests):
            try:
                key, top_ks[i], texts = self._decode(request)
            except ServingError as e:
                answers.send(i, error_response(pb_utils, e, self.config.name))
                continue
            by_choice.setdefault(key, []).append((i, texts))
        calls = []
        for (requested, version, fallback), members in by_choice.items():
            calls += self._calls(members, requested, version, fallback, overloaded)
        for done in run_calls(calls, self.plan.encoders, self._run(requests), self.pool):
            self._answer(done, top_ks, answers)
