"""Configs generated from a pipeline spec (stand-in encoders): names, marks, versions, lint."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import tiny_checkpoints
from tritonforge.export.pipeline_configs import generate_files, write_pipeline
from tritonforge.export.pipeline_spec import Canary, ModelVersion
from tritonforge.export.specs.from_pretrained import pipeline_from_pretrained
from tritonforge.export.tritonconfig import render_pbtxt
from tritonforge.modelconfig import ModelConfig
from tritonforge.pipelines import from_repository
from tritonforge.runtime.launcher.lint import lint_repository


def stand_in_encoder(repo: Path, name: str, versions: list[int]) -> None:
    config = {
        "name": name,
        "backend": "onnxruntime",
        "max_batch_size": 64,
        "input": [
            {"name": n, "data_type": "TYPE_INT64", "dims": [-1]}
            for n in ("input_ids", "attention_mask")
        ],
        "output": [
            {
                "name": "logits",
                "data_type": "TYPE_FP32",
                "dims": [3],
                "label_filename": "labels.txt",
            }
        ],
        "parameters": {"tritonforge.pipeline": {"string_value": "ab"}},
    }
    (repo / name).mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(render_pbtxt(config))
    for v in versions:
        (repo / name / str(v)).mkdir()
        (repo / name / str(v) / "model.onnx").write_bytes(b"stand-in")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ckpt")
    return tiny_checkpoints.roberta(root / "r", tiny_checkpoints.LABELS)


def test_classification_pipeline_with_two_versions(tmp_path: Path, checkpoint: Path) -> None:
    v2 = pipeline_from_pretrained(checkpoint, "classification", "ab").encoder
    spec = pipeline_from_pretrained(
        checkpoint,
        "classification",
        "ab",
        variants=("fp32", "int8"),
        extra_versions=(ModelVersion(2, v2),),
        canary=Canary(((1, 90), (2, 10))),
    )
    assert spec.encoder.serving is not None and spec.encoder.serving.versions == (1, 2)
    repo = tmp_path / "repo"
    stand_in_encoder(repo, "ab_encoder_fp32", [1, 2])
    files = generate_files(spec, repo)
    # int8 not exported: no ensemble for it, and the BLS lists only what exists
    assert "ab_int8/config.pbtxt" not in files
    write_pipeline(spec, repo)
    bls = ModelConfig.from_pbtxt((repo / "ab_bls" / "config.pbtxt").read_text())
    assert bls.parameters["encoder_models"] == "fp32=ab_encoder_fp32"
    assert bls.parameters["versions"] == "1,2"
    assert bls.parameters["version_weights"] == "1=90,2=10"
    assert [o.name for o in bls.outputs][-2:] == ["model_version", "variant"]
    # degradation: declared off (requests may still opt in), thresholds from the spec
    assert spec.bls is not None
    degrade = spec.bls.degrade
    assert bls.parameters["degrade_enabled"] == "false"
    assert bls.parameters["degrade_to"] == degrade.to
    assert bls.parameters["degrade_max_queued"] == str(degrade.max_queued)
    assert bls.parameters["degrade_max_queue_delay_ms"] == str(degrade.max_queue_delay_ms)
    # priority levels on every queue the pipeline owns, unmarked requests at the last (bulk)
    for model in ("ab_bls", "ab_tokenizer", "ab_postprocess"):
        config = ModelConfig.from_pbtxt((repo / model / "config.pbtxt").read_text())
        batching = config.raw["dynamic_batching"]
        assert int(batching["priority_levels"]) == spec.priority_levels == 2, model
        assert int(batching["default_priority_level"]) == spec.priority_levels, model
    pipeline = from_repository(repo)["ab"]
    assert pipeline.labels == tiny_checkpoints.LABELS and pipeline.dim == 3
    assert pipeline.ensembles == {"fp32": "ab"} and pipeline.bls == "ab_bls"
    assert lint_repository(repo) == []
    # a second run changes nothing
    assert write_pipeline(spec, repo) == []


def test_generation_needs_the_exported_fp32_encoder(tmp_path: Path, checkpoint: Path) -> None:
    from tritonforge.export.errors import ExportError

    spec = pipeline_from_pretrained(checkpoint, "classification", "ab")
    with pytest.raises(ExportError, match="ab_encoder_fp32 is not in"):
        generate_files(spec, tmp_path)


def test_spec_refuses_bad_canary(checkpoint: Path) -> None:
    from tritonforge.export.errors import SpecError

    with pytest.raises(SpecError, match="canary weights"):
        pipeline_from_pretrained(
            checkpoint, "classification", "ab", canary=Canary(((1, 50), (3, 50)))
        )


def test_a_task_checks_its_own_spec_section(checkpoint: Path) -> None:
    """The task's share validates its section (tasks/<task>/export.py): a classifier needs its
    labels, an embedding pipeline takes none, an unknown task names the registered ones."""
    import dataclasses

    from tritonforge.export.errors import SpecError
    from tritonforge.tasks.classification.spec import Classification

    spec = pipeline_from_pretrained(checkpoint, "classification", "ab")
    assert isinstance(spec.head, Classification) and "ab_postprocess" in spec.model_names()
    with pytest.raises(SpecError, match="needs a `head` section"):
        dataclasses.replace(spec, head=None)
    with pytest.raises(SpecError, match="at least two labels"):
        dataclasses.replace(spec, head=Classification(("only",)))
    with pytest.raises(SpecError, match="takes no `head` section"):
        dataclasses.replace(spec, task="embedding")
    with pytest.raises(SpecError, match="is not one of"):
        dataclasses.replace(spec, task="rerankk")
