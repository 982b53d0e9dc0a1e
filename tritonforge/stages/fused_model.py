"""Fused first step: BYTES ``text`` -> tokens -> the encoder's ONNX graph -> public outputs.

One model where the ensemble ran two or three (tokenizer -> encoder -> postprocess): the plan is
read from this config's parameters as the BLS reads its own (:mod:`tritonforge.fused`), the graph
and its session options from the encoder model's config and file, so the answers are the
encoder's. A request's ``top_k`` parameter (classifiers) is read as the postprocess reads it.
"""

import triton_python_backend_utils as pb_utils

import json
from pathlib import Path

import onnxruntime as ort

from tritonforge.batching import rows_alone
from tritonforge.bls import build_plan
from tritonforge.bls_parameters import request_top_k
from tritonforge.errors import ServingError
from tritonforge.fused import FusedRunner, Member, check_digest, encoder_graph
from tritonforge.integrity import verify_sidecar
from tritonforge.modelconfig import ModelConfig
from tritonforge.ort_options import session_options
from tritonforge.text import TextTokenizer, decode_texts
from tritonforge.triton import encode_response, error_response


class TritonPythonModel:
    def initialize(self, args):
        self.config = ModelConfig.from_json(args["model_config"])
        repository = Path(args["model_repository"]).parent
        self.plan = build_plan(self.config, repository)
        graph = encoder_graph(self.plan, repository)
        settings = self.plan.tokenizer
        verify_sidecar(settings.path, required=True)  # the tokenizer model's file (make export)
        # the encoder's graph (make export), the one this config was generated for
        check_digest(self.config, graph, verify_sidecar(graph.path, required=True))
        tokenizer = TextTokenizer(
            settings.path,
            settings.max_length,
            settings.pad_to_multiple_of,
            outputs=settings.outputs,
            pad_id=settings.pad_id,
        )
        # the encoder's own threads and session.* entries (spinning off, ...)
        options = session_options(ort, graph.config.parameters)
        session = ort.InferenceSession(str(graph.path), options, providers=["CPUExecutionProvider"])
        names = [graph.target.output]
        graph_inputs = {t.name for t in session.get_inputs()}

        def run(feed):
            feed = {k: v for k, v in feed.items() if k in graph_inputs}
            return dict(zip(names, session.run(names, feed), strict=True))

        axis_names = {
            t.name: [d if isinstance(d, str) else None for d in t.shape]
            for t in [*session.get_inputs(), *session.get_outputs()]
        }
        # resolved at export (the image has no onnx to read the graph); else the encoder's
        alone = rows_alone(graph.path, self.config.param("batch_rows", "", str) or "auto")
        self.runner = FusedRunner(self.plan, graph, tokenizer, run, axis_names, alone)
        pb_utils.Logger.log_info(
            f"{self.config.name}: {graph.target.model} {graph.path.name} on onnxruntime "
            f"{ort.__version__} {json.dumps(axis_names)}; rows {'alone' if alone else 'batched'}"
        )

    def _member(self, index, request):
        post = self.plan.postprocess
        top_k = request_top_k(request.parameters(), post) if post is not None else 0
        values = pb_utils.get_input_tensor_by_name(request, self.plan.text_input).as_numpy()
        return Member(index, decode_texts(values, self.plan.text_input, self.plan.limits), top_k)

    def execute(self, requests):
        responses = [None] * len(requests)
        members = []
        for i, request in enumerate(requests):
            try:
                members.append(self._member(i, request))
            except ServingError as e:
                responses[i] = error_response(pb_utils, e, self.config.name)
        try:
            for i, answer in self.runner.answer(members):
                if isinstance(answer, Exception):
                    responses[i] = error_response(pb_utils, answer, self.config.name)
                else:
                    responses[i] = encode_response(pb_utils, answer, self.config)
        except Exception as e:  # tokenizing failed: every member still gets its one answer
            for m in members:
                if responses[m.index] is None:
                    responses[m.index] = error_response(pb_utils, e, self.config.name)
        return responses
