"""The model-config layer: typed configs, the one renderer (through model_config_pb2), the parser."""

from __future__ import annotations

import dataclasses

import pytest

from tritonforge.configschema import (
    Accelerator,
    DynamicBatching,
    EnsembleStep,
    InstanceGroup,
    Optimization,
    QueueLimits,
    QueuePolicy,
    TritonConfig,
    VersionPolicy,
    Warmup,
    WarmupInput,
    params,
    parse_pbtxt,
    render_compact,
    render_pbtxt,
)
from tritonforge.errors import ModelConfigError
from tritonforge.export.pipeline_spec import BlsStage, TokenizerStage
from tritonforge.export.spec import Serving
from tritonforge.modelconfig import ModelConfig, TensorSpec

ENCODER = TritonConfig(
    name="enc",
    backend="onnxruntime",
    max_batch_size=64,
    default_model_filename="model.onnx",
    inputs=(TensorSpec("input_ids", "TYPE_INT64", (-1,)),),
    outputs=(TensorSpec("logits", "TYPE_FP32", (3,), label_filename="labels.txt"),),
    version_policy=VersionPolicy((1, 2)),
    instance_groups=(InstanceGroup(2, "KIND_GPU"),),
    parameters=params({"pad_values": "input_ids=0", "max_length": 128}),
    dynamic_batching=DynamicBatching(2000, (16, 32), 2, QueuePolicy(64, 10_000_000)),
    response_cache=True,
    optimization=Optimization((Accelerator("tensorrt", params({"precision_mode": "FP16"})),)),
    warmup=(Warmup("real_sample", (WarmupInput("input_ids", "TYPE_INT64", (8,), "input_ids"),)),),
)
ENSEMBLE = TritonConfig(
    name="embed",
    platform="ensemble",
    max_batch_size=64,
    inputs=(TensorSpec("text", "TYPE_STRING", (1,)),),
    outputs=(TensorSpec("embedding", "TYPE_FP32", (384,)),),
    ensemble_steps=(
        EnsembleStep("tok", (("text", "text"),), (("input_ids", "input_ids"),)),
        EnsembleStep("enc", (("input_ids", "input_ids"),), (("emb", "embedding"),)),
    ),
)
GENERATE = TritonConfig(
    name="generate",
    backend="python",
    max_batch_size=0,
    decoupled=True,
    inputs=(
        TensorSpec("text_input", "TYPE_STRING", (1,)),
        TensorSpec("stop", "TYPE_STRING", (-1,), optional=True),
    ),
    outputs=(TensorSpec("text_output", "TYPE_STRING", (1,)),),
    instance_groups=(InstanceGroup(1),),
    parameters=params({"z_last": "1", "a_first": 'say "hi"'}),
)


@pytest.mark.parametrize("config", [ENCODER, ENSEMBLE, GENERATE], ids=lambda c: c.name)
def test_render_then_parse_gives_the_same_config(config: TritonConfig) -> None:
    parsed = parse_pbtxt(render_pbtxt(config))
    assert parsed.to_json() == config.to_json()
    # parameters come back in the printed (key) order; everything else is equal as declared
    assert dataclasses.replace(parsed, parameters=config.parameters) == config
    assert dict(parsed.parameters) == dict(config.parameters)


def test_the_serving_view_reads_what_was_rendered() -> None:
    served = ModelConfig.from_pbtxt(render_pbtxt(ENCODER))
    assert served.name == "enc" and served.batched
    assert served.output("logits").label_filename == "labels.txt"
    assert served.param("max_length", kind=int) == 128


def test_a_config_outside_tritons_schema_is_refused_naming_the_field() -> None:
    bad = dataclasses.replace(ENCODER, instance_groups=(InstanceGroup(1, "KIND_TPU"),))
    with pytest.raises(ModelConfigError, match=r"'enc'.*instance_group.*kind"):
        render_pbtxt(bad)
    wrong_type = dataclasses.replace(ENSEMBLE, inputs=(TensorSpec("text", "TYPE_TEXT", (1,)),))
    with pytest.raises(ModelConfigError, match=r"input.*data_type"):
        render_pbtxt(wrong_type)


def test_the_compact_layout_keeps_declaration_order_and_parses_to_the_same_message() -> None:
    text = render_compact(GENERATE, ["a comment"])
    assert text.startswith('# a comment\nname: "generate"\n')
    assert "model_transaction_policy { decoupled: true }" in text
    assert '{ name: "stop" data_type: TYPE_STRING dims: [ -1 ] optional: true }' in text
    assert text.index('"z_last"') < text.index('"a_first"')
    assert parse_pbtxt(text).to_json() == GENERATE.to_json()


def test_the_compact_layout_refuses_a_field_it_does_not_print() -> None:
    batched = dataclasses.replace(GENERATE, dynamic_batching=DynamicBatching())
    with pytest.raises(ModelConfigError, match="render_pbtxt"):
        render_compact(batched)


def test_the_queue_knobs_are_declared_once() -> None:
    for stage, size in ((Serving(fp32_name="e"), 64), (TokenizerStage(), 128), (BlsStage(), 32)):
        assert isinstance(stage, QueueLimits)
        assert (stage.max_queue_delay_us, stage.max_queue_size) == (0, size)
        assert stage.queue_timeout_us == 10_000_000
    batching = DynamicBatching.of(BlsStage(max_queue_size=5, queue_timeout_us=7), 2).to_json()
    assert batching["default_queue_policy"]["max_queue_size"] == 5
    assert batching["default_queue_policy"]["default_timeout_microseconds"] == 7
    assert batching["priority_levels"] == batching["default_priority_level"] == 2
    assert "default_queue_policy" not in DynamicBatching.of(QueueLimits(max_queue_size=0)).to_json()
