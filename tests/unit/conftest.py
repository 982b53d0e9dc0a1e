"""Unit fixtures shared by several files."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tritonforge.export.pipeline_configs import write_pipeline
from tritonforge.export.pipeline_spec import PipelineSpec
from tritonforge.export.specs import get_pipeline

ONNX_INPUTS = ["input_ids", "attention_mask", "token_type_ids"]


def encoder_config(name: str, backend: str, inputs: list[str], output: str) -> str:
    tensors = ", ".join(f'{{ name: "{n}" data_type: TYPE_INT64 dims: [ -1 ] }}' for n in inputs)
    return (
        f'name: "{name}"\nbackend: "{backend}"\nmax_batch_size: 64\n'
        f"input [ {tensors} ]\n"
        f'output [ {{ name: "{output}" data_type: TYPE_FP32 dims: [ 384 ] }} ]\n'
    )


@pytest.fixture(scope="module")
def embed_spec() -> PipelineSpec:
    return get_pipeline("minilm")


@pytest.fixture
def embed_repo(tmp_path: Path, embed_spec: PipelineSpec) -> Path:
    """Stand-in encoders and artifacts plus the pipeline configs generated from the spec."""
    return stand_in_repo(tmp_path / "repo", embed_spec)


@pytest.fixture
def unfused_repo(tmp_path: Path, embed_spec: PipelineSpec) -> Path:
    """:func:`embed_repo` with ``fused=False``: every ensemble runs tokenizer -> encoder."""
    return stand_in_repo(tmp_path / "repo", dataclasses.replace(embed_spec, fused=False))


def stand_in_repo(root: Path, spec: PipelineSpec) -> Path:
    encoders = {
        "encoder_fp32": ("onnxruntime", ONNX_INPUTS, "sentence_embedding", "model.onnx"),
        "encoder_int8": ("onnxruntime", ONNX_INPUTS, "sentence_embedding", "model.onnx"),
        "encoder_torchscript": (
            "pytorch",
            [f"INPUT__{i}" for i in range(3)],
            "OUTPUT__0",
            "model.pt",
        ),
    }
    for name, (backend, inputs, output, artifact) in encoders.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(encoder_config(name, backend, inputs, output))
        (root / name / "1" / artifact).write_bytes(b"stand-in")
    write_pipeline(spec, root)
    return root
