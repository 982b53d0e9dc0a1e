"""Tokenizer stage: BYTES ``text`` -> the encoder's int64 inputs (see config.pbtxt)."""

import triton_python_backend_utils as pb_utils

from pathlib import Path

from tritonforge.errors import ServingError
from tritonforge.integrity import verify_sidecar
from tritonforge.modelconfig import ModelConfig
from tritonforge.repository import feed_mapping, load_model_config
from tritonforge.text import TextLimits, TextTokenizer, decode_texts, split_tokens
from tritonforge.triton import encode_response, error_response


class TritonPythonModel:
    def initialize(self, args):
        self.config = ModelConfig.from_json(args["model_config"])
        model_dir = Path(args["model_repository"])
        # Refuse to load when our outputs are not exactly the encoder's inputs.
        encoder = load_model_config(model_dir.parent, self.config.param("encoder_model"))
        feed_mapping(self.config.outputs, encoder, positional=False)
        self.field = self.config.inputs[0].name
        self.limits = TextLimits(
            max_items=self.config.param("max_items", self.config.max_batch_size, int),
            max_text_bytes=self.config.param("max_text_bytes", TextLimits.max_text_bytes, int),
        )
        path = model_dir / args["model_version"] / self.config.param("tokenizer_file")
        verify_sidecar(path, required=True)  # written by `make export`; missing/mismatch: no load
        self.pad_to = self.config.param("pad_to_multiple_of", 1, int)
        self.tokenizer = TextTokenizer(
            path,
            self.config.param("max_length", kind=int),
            self.pad_to,
            outputs=[t.name for t in self.config.outputs],
            pad_id=self.config.param("pad_id", 0, int),
        )

    def execute(self, requests):
        responses = [None] * len(requests)
        texts, members = [], []
        for i, request in enumerate(requests):
            try:
                values = pb_utils.get_input_tensor_by_name(request, self.field).as_numpy()
                batch = decode_texts(values, self.field, self.limits)
            except ServingError as e:
                responses[i] = error_response(pb_utils, e, self.config.name)
                continue
            texts.extend(batch)
            members.append((i, len(batch)))
        if members:
            try:
                counts = [n for _, n in members]
                parts = split_tokens(
                    self.tokenizer.encode(texts), counts, pad_to_multiple_of=self.pad_to
                )
                for (i, _), tokens in zip(members, parts, strict=True):
                    responses[i] = encode_response(pb_utils, tokens, self.config)
            except Exception as e:
                for i, _ in members:
                    responses[i] = error_response(pb_utils, e, self.config.name)
        return responses
