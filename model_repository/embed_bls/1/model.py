"""BLS orchestrator: text -> tokenizer -> encoder (per-request ``variant``) -> postprocess.

``execute`` is a coroutine: the requests of one execute run concurrently, each awaiting its stages
with ``async_exec``; a bad request fails alone with INVALID_ARG or UNAVAILABLE naming the stage.
"""

import triton_python_backend_utils as pb_utils

import asyncio
from pathlib import Path

from tritonforge.bls import build_plan, request_variant, run_route, text_tensor
from tritonforge.modelconfig import ModelConfig
from tritonforge.text import decode_texts
from tritonforge.triton import encode_response, error_response


class TritonPythonModel:
    def initialize(self, args):
        self.config = ModelConfig.from_json(args["model_config"])
        self.plan = build_plan(self.config, Path(args["model_repository"]).parent)

    async def _one(self, request):
        try:
            variant = request_variant(request.parameters(), self.plan)
            values = pb_utils.get_input_tensor_by_name(request, self.plan.text_input).as_numpy()
            texts = decode_texts(values, self.plan.text_input, self.plan.limits)
            embedding = await run_route(
                pb_utils, self.plan, variant, text_tensor(texts), trace=request.trace()
            )
            return encode_response(pb_utils, {self.plan.output: embedding}, self.config)
        except Exception as e:
            return error_response(pb_utils, e, self.config.name)

    async def execute(self, requests):
        return list(await asyncio.gather(*(self._one(r) for r in requests)))
