"""Decoder export data that needs no model: the generated configs (one model per variant,
discoverable), the naming rule and clean."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tritonforge.export.decoder.config import clean_decoders, files, models, render_config
from tritonforge.export.decoder.genai import BUILDER_MODULE, HEAD_AXIS, builder_command, single_file
from tritonforge.export.specs.smollm2 import smollm2_spec
from tritonforge.modelconfig import ModelConfig, pbtxt_to_dict
from tritonforge.pipelines import VARIANT_KEY, discover_generators


def test_config_is_rendered_from_the_spec_and_decoupled() -> None:
    spec = smollm2_spec()
    config = ModelConfig.from_pbtxt(render_config(spec, "fp32", int8=True))
    assert config.name == spec.serving.model_name
    assert config.raw["model_transaction_policy"]["decoupled"] is True
    assert config.param("max_running", kind=int) == spec.serving.max_running
    assert config.param("max_prompt_tokens", kind=int) == spec.serving.max_prompt_tokens
    assert config.param("queue_timeout_s", kind=float) == spec.serving.queue_timeout_s
    assert [t.name for t in config.outputs] == ["text_output", "finish_reason"]
    assert [t.name for t in config.inputs if not t.optional] == ["text_input"]


def _configs(spec: object, int8: bool) -> list[dict]:
    return [
        pbtxt_to_dict(render_config(spec, v, int8))  # type: ignore[arg-type]
        for v in models(spec, int8)  # type: ignore[arg-type]
    ]


def test_every_variant_is_its_own_discoverable_model() -> None:
    """fp32 and int8 are two models (Triton's per-model metrics then describe one decoder
    each); discovery maps variant -> model and names the default, from the configs alone."""
    spec = smollm2_spec()
    found = discover_generators(_configs(spec, int8=True))
    group = found[spec.serving.model_name]
    assert group.variants == ("fp32", "int8")
    assert group.default_variant == spec.serving.default_variant
    assert group.model() == spec.serving.model_name  # the default keeps the plain name
    other = next(v for v in group.variants if v != group.default_variant)
    assert group.model(other) == f"{spec.serving.model_name}_{other}"
    for variant, model in group.models.items():
        config = ModelConfig.from_pbtxt(render_config(spec, variant, int8=True))
        assert config.name == model and config.param(VARIANT_KEY) == variant
    with pytest.raises(KeyError, match="int4"):
        group.model("int4")
    # Without int8 only fp32 is exported, under the plain name whatever the spec's default.
    alone = discover_generators(_configs(spec, int8=False))[spec.serving.model_name]
    assert alone.models == {"fp32": spec.serving.model_name}


def test_an_int8_default_takes_the_plain_name_and_fp32_keeps_parity_under_its_own() -> None:
    spec = smollm2_spec()
    spec = dataclasses.replace(
        spec, serving=dataclasses.replace(spec.serving, default_variant="int8")
    )
    group = discover_generators(_configs(spec, int8=True))[spec.serving.model_name]
    assert group.models == {"fp32": "generate_fp32", "int8": "generate"}
    assert group.default_variant == "int8"


def test_each_variant_directory_is_self_contained() -> None:
    spec = smollm2_spec()
    paths = files(spec, int8=True)
    for variant, model in models(spec, int8=True).items():
        mine = {r.split(".", 1)[1]: p for r, p in paths.items() if r.startswith(f"{variant}.")}
        assert set(mine) == {"decoder", "tokenizer", "generation"}
        assert all(p.startswith(f"{model}/1/") for p in mine.values())


def test_clean_removes_generated_files_and_keeps_model_py(tmp_path: Path) -> None:
    spec = smollm2_spec()
    names = models(spec, int8=True).values()
    for name in names:
        model = tmp_path / name
        (model / "1").mkdir(parents=True)
        (model / "1" / "model.py").write_text("# committed\n")
        (model / "config.pbtxt").write_text("")
        (model / "1" / "export_report.json").write_text("{}")
    for rel in files(spec, int8=True).values():
        (tmp_path / rel).write_text("x")
        (tmp_path / f"{rel}.sha256").write_text("x")
    removed = clean_decoders(tmp_path, [spec])
    assert len(removed) == len(names) * (2 * 3 + 2)
    for name in names:
        left = sorted(p.name for p in (tmp_path / name).rglob("*") if p.is_file())
        assert left == ["model.py"]


def test_the_graph_builder_and_its_options_come_from_the_spec(tmp_path: Path) -> None:
    """The GenAI builder's command line: fp32, and int8 with the spec's ``int8_method``."""
    spec = smollm2_spec()
    assert spec.graph is not None
    fp32 = builder_command(tmp_path / "hf", tmp_path, spec.graph, None)
    assert fp32[1:3] == ["-m", BUILDER_MODULE]
    assert fp32[fp32.index("-p") + 1] == "fp32" and "--extra_options" not in fp32
    q = spec.int8_method
    int8 = builder_command(tmp_path / "hf", tmp_path, spec.graph, q)
    assert int8[int8.index("-p") + 1] == f"int{q.bits}"
    options = int8[int8.index("--extra_options") + 1 :]
    assert options == [f"block_size={q.block_size}", f"accuracy_level={q.accuracy_level}"]
    assert int8[int8.index("-e") + 1] == spec.graph.execution_provider == "cpu"


def test_the_builders_graph_becomes_one_file_with_a_concrete_head_axis(tmp_path: Path) -> None:
    """The builder writes external data and a symbolic head axis; the served decoder.onnx is
    one self-contained file whose caches' head axis OrtDecoder can read."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    kv: list[str | int | None] = ["b", 1, "p", HEAD_AXIS]
    past = helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, kv)
    present = helper.make_tensor_value_info("present.0.key", TensorProto.FLOAT, kv)
    weight = numpy_helper.from_array(np.ones((1, 1, 1, 4), np.float32), "w")
    node = helper.make_node("Mul", ["past_key_values.0.key", "w"], ["present.0.key"])
    graph = helper.make_graph([node], "g", [past], [present], initializer=[weight])
    src = tmp_path / "out" / "model.onnx"
    src.parent.mkdir()
    onnx.save_model(
        helper.make_model(graph),
        str(src),
        save_as_external_data=True,
        location="model.onnx.data",
        size_threshold=0,
    )
    assert (src.parent / "model.onnx.data").is_file()
    single_file(src, tmp_path / "decoder.onnx", 4)
    (src.parent / "model.onnx.data").unlink()  # the result must not need it
    model = onnx.load(str(tmp_path / "decoder.onnx"))
    for value in (*model.graph.input, *model.graph.output):
        dims = value.type.tensor_type.shape.dim
        assert dims[3].dim_value == 4 and not dims[3].dim_param
    assert numpy_helper.to_array(model.graph.initializer[0]).sum() == 4
