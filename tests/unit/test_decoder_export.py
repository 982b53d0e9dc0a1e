"""Decoder export data that needs no model: the generated configs (one model per variant,
discoverable), the naming rule and clean."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from tritonforge.export.flow import Steps
from tritonforge.export.specs.smollm2 import smollm2_spec
from tritonforge.export.staging import Staging
from tritonforge.modelconfig import ModelConfig, pbtxt_to_dict
from tritonforge.pipelines import (
    VARIANT_KEY,
    discover_generators,
    repository_configs,
    single_generator,
)
from tritonforge.tasks.generation.export.config import (
    clean_decoders,
    files,
    int8_served,
    models,
    render_config,
    stale_models,
)
from tritonforge.tasks.generation.export.genai import (
    BUILDER_MODULE,
    HEAD_AXIS,
    builder_command,
    single_file,
)
from tritonforge.tasks.generation.export.spec import DecoderSpec


def test_config_is_rendered_from_the_spec_and_decoupled() -> None:
    spec = smollm2_spec()
    config = ModelConfig.from_pbtxt(render_config(spec, spec.serving.default_variant, int8=True))
    assert config.name == spec.serving.model_name
    assert config.raw["model_transaction_policy"]["decoupled"] is True
    assert config.param("max_running", kind=int) == spec.serving.max_running
    assert config.param("max_prompt_tokens", kind=int) == spec.serving.max_prompt_tokens
    assert config.param("queue_timeout_s", kind=float) == spec.serving.queue_timeout_s
    assert [t.name for t in config.outputs] == ["text_output", "finish_reason", "logprobs"]
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


def test_the_default_follows_the_spec_and_falls_back_to_fp32() -> None:
    """The spec's default (int8: the fastest variant through its gate) takes the plain name and
    fp32 keeps exact parity under its own; without int8 served, fp32 is the default; a spec
    that says fp32 keeps fp32 the default even with int8 served."""
    spec = smollm2_spec()
    assert spec.serving.default_variant == "int8"
    group = discover_generators(_configs(spec, int8=True))[spec.serving.model_name]
    assert group.models == {"fp32": "generate_fp32", "int8": "generate"}
    assert group.default_variant == "int8" and group.model() == "generate"
    alone = discover_generators(_configs(spec, int8=False))[spec.serving.model_name]
    assert alone.models == {"fp32": "generate"} and alone.default_variant == "fp32"
    fp32_spec = dataclasses.replace(
        spec, serving=dataclasses.replace(spec.serving, default_variant="fp32")
    )
    group = discover_generators(_configs(fp32_spec, int8=True))[spec.serving.model_name]
    assert group.models == {"fp32": "generate", "int8": "generate_int8"}
    assert group.default_variant == "fp32"


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


def _old_layout(repo: Path, spec: DecoderSpec) -> None:
    """What the export wrote when fp32 was the default: ``generate`` (fp32), ``generate_int8``."""
    old = dataclasses.replace(
        spec, serving=dataclasses.replace(spec.serving, default_variant="fp32")
    )
    for variant, model in models(old, int8=True).items():
        (repo / model / "1").mkdir(parents=True)
        (repo / model / "config.pbtxt").write_text(render_config(old, variant, int8=True))
        (repo / model / "1" / "decoder.onnx").write_text(f"old {variant}")
    (repo / "embed").mkdir()  # another model: not this group's, never touched
    (repo / "embed" / "config.pbtxt").write_text('name: "embed"\nbackend: "python"\n')


def _build(spec: DecoderSpec, repo: Path, int8: bool) -> tuple[Any, Staging]:
    """The export's build with its decoders stubbed by marker files: only the placing of the
    served models (no checkpoint, no ONNX)."""
    from tritonforge.tasks.generation.export.steps import _DecoderBuild

    staging = Staging(repo)
    steps = Steps(spec.name, lambda line: None)
    build = _DecoderBuild(spec, staging, steps, {"libraries": {}}, int8)
    for role, path in build.out.items():
        path.write_text(f"new {role}")
    return build, staging


@pytest.mark.parametrize(
    ("refused", "want"),
    [
        ([], {"generate": "new int8", "generate_fp32": "new decoder"}),
        (["int8 gate: perplexity ratio 1.2 > 1.05"], {"generate": "new decoder"}),
    ],
)
def test_the_export_serves_the_default_and_removes_names_it_no_longer_serves(
    tmp_path: Path, refused: list[str], want: dict[str, str]
) -> None:
    """int8 through its gate: ``generate`` is int8, ``generate_fp32`` fp32, and the earlier
    ``generate_int8`` is gone (Triton would serve it too). int8 refused by its gate: fp32 is
    ``generate``, no int8 model is left, and the report records why (and the next export plans
    those names: int8_served)."""
    spec, repo = smollm2_spec(), tmp_path / "repo"
    _old_layout(repo, spec)
    build, staging = _build(spec, repo, int8=True)
    try:
        build._place(build._default(refused))
        staging.commit()
    finally:
        staging.discard()
    served = sorted(p.name for p in repo.iterdir() if p.name != "embed")
    assert served == sorted(want)
    for model, decoder in want.items():
        assert (repo / model / "1" / "decoder.onnx").read_text() == decoder
        assert (repo / model / "1" / "model.py").is_file()  # the whole directory, served as is
        config = ModelConfig.from_pbtxt((repo / model / "config.pbtxt").read_text())
        assert config.name == model
    group = discover_generators(repository_configs(repo))[spec.serving.model_name]
    assert group.default_variant == ("fp32" if refused else "int8")
    record = build.report["default"]
    assert record["int8_refused"] == refused and record["variant"] == group.default_variant
    assert (repo / "embed" / "config.pbtxt").is_file()
    (repo / "generate" / "1" / "export_report.json").write_text(json.dumps(build.report))
    assert int8_served(spec, repo, int8=True) is not refused
    assert int8_served(spec, repo, int8=False) is False


def test_int8_served_when_no_report_says_otherwise(tmp_path: Path) -> None:
    assert int8_served(smollm2_spec(), tmp_path, int8=True)
    assert stale_models(smollm2_spec(), tmp_path, ["generate"]) == []


def test_benches_and_load_tests_find_the_one_group_by_discovery() -> None:
    spec = smollm2_spec()
    found = discover_generators(_configs(spec, int8=True))
    assert single_generator(found, "repo").model() == spec.serving.model_name
    with pytest.raises(LookupError, match="none"):
        single_generator({}, "repo")


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
