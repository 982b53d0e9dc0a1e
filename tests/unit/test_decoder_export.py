"""Decoder export data that needs no model: the generated config and clean."""

from __future__ import annotations

from pathlib import Path

from tritonforge.export.decoder.config import clean_decoders, files, render_config
from tritonforge.export.specs.smollm2 import smollm2_spec
from tritonforge.modelconfig import ModelConfig


def test_config_is_rendered_from_the_spec_and_decoupled() -> None:
    spec = smollm2_spec()
    config = ModelConfig.from_pbtxt(render_config(spec, int8=True))
    assert config.name == spec.serving.model_name
    assert config.raw["model_transaction_policy"]["decoupled"] is True
    assert config.param("max_running", kind=int) == spec.serving.max_running
    assert config.param("max_prompt_tokens", kind=int) == spec.serving.max_prompt_tokens
    assert [t.name for t in config.outputs] == ["text_output", "finish_reason"]
    assert [t.name for t in config.inputs if not t.optional] == ["text_input"]


def test_clean_removes_generated_files_and_keeps_model_py(tmp_path: Path) -> None:
    spec = smollm2_spec()
    model = tmp_path / spec.serving.model_name
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text("# committed\n")
    (model / "config.pbtxt").write_text("")
    for rel in files(spec, int8=True).values():
        (tmp_path / rel).write_text("x")
        (tmp_path / f"{rel}.sha256").write_text("x")
    (model / "1" / "export_report.json").write_text("{}")
    removed = clean_decoders(tmp_path, [spec])
    assert len(removed) == 2 * 4 + 2
    assert sorted(p.name for p in model.rglob("*") if p.is_file()) == ["model.py"]
