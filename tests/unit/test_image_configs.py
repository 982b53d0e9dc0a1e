"""The image pipeline's configs are generated from its spec (tasks/image/export/configs.py): the
preprocess stage reads back the declared preprocessing, the classification outputs carry the
labels file, top_k never exceeds the classes, the canaries get a valid image; the client cuts
requests under the front's body limit."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
from PIL import Image

import tritonforge.client  # noqa: F401  (first: a task's client module imported alone is a cycle)
from tritonforge.modelconfig import ModelConfig
from tritonforge.repository import CANARY_KEY
from tritonforge.runtime.supervisor.canaries import CANARY_TEXT, canary_inputs
from tritonforge.tasks.image.client import request_batches
from tritonforge.tasks.image.export.configs import BLS, PREPROCESS, image_configs, render
from tritonforge.tasks.image.preprocessing import ImagePreprocessing
from tritonforge.tasks.image.spec import EFFICIENTNET_LITE0 as SPEC


def _configs(spec=SPEC) -> dict[str, ModelConfig]:  # type: ignore[no-untyped-def]
    return {
        c.name: ModelConfig.from_pbtxt(render(c, spec).decode())
        for c, _ in image_configs(spec, (3, -1, -1))
    }


def test_the_preprocess_stage_reads_back_the_declared_preprocessing() -> None:
    configs = _configs()
    kinds = {c.name: k for c, k in image_configs(SPEC, (3, -1, -1))}
    assert kinds[SPEC.preprocess_model] == PREPROCESS and kinds[SPEC.bls] == BLS
    for model in (SPEC.preprocess_model, SPEC.bls):
        read = ImagePreprocessing.from_parameters(configs[model].parameters)
        assert read == SPEC.preprocessing, model
    pixels = configs[SPEC.preprocess_model].outputs[0]
    assert pixels.dims == SPEC.preprocessing.output_shape()
    assert configs[SPEC.model].inputs[0].dims == (3, -1, -1)  # the graph's


def test_the_public_outputs_name_the_labels_and_top_k_fits_the_classes() -> None:
    configs = _configs()
    for model in (SPEC.ensemble, SPEC.bls, SPEC.postprocess_model):
        assert configs[model].output("probabilities").label_filename == "labels.txt"
        assert configs[model].param("top_k", kind=int) == 5
    four = _configs(dataclasses.replace(SPEC, classes=4))
    assert four[SPEC.postprocess_model].param("top_k", kind=int) == 4


def test_the_canaries_send_the_declared_image_to_the_public_models() -> None:
    configs = _configs()
    for model in (SPEC.ensemble, SPEC.bls):
        (value,) = canary_inputs(configs[model]).values()
        with Image.open(io.BytesIO(value.reshape(-1)[0])) as image:
            assert image.size == (32, 32)
    text = canary_inputs(dataclasses.replace(configs[SPEC.ensemble], parameters={}))
    assert next(iter(text.values())).reshape(-1)[0] == CANARY_TEXT
    assert CANARY_KEY in configs[SPEC.ensemble].parameters


def test_requests_stay_under_the_byte_budget_and_the_item_limit() -> None:
    items = [b"x" * n for n in (600, 600, 600, 2000, 10, 10, 10)]
    batches = request_batches(items, max_items=2, max_bytes=1300)
    assert [len(b) for b in batches] == [2, 1, 1, 2, 1]
    assert [x for b in batches for x in b] == items
    assert np.all([sum(map(len, b)) <= 1300 or len(b) == 1 for b in batches])


def test_chaos_traffic_sends_the_declared_image_not_text() -> None:
    import base64

    import tritonclient.http as httpclient

    from tritonforge.loadtest.reliability.chaos.probes import Target

    config = _configs()[SPEC.ensemble]
    target = Target(SPEC.ensemble, SPEC.ensemble, config, "image", ("image",))
    (tensor,) = target.tensors(httpclient, "chaos request 1")
    sent = tensor._get_binary_data() or b""
    assert base64.b64decode(config.parameters[CANARY_KEY]) in sent
    assert b"chaos request" not in sent
