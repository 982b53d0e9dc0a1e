"""Model names left in the deployment files are checked against the repository's configs, and
the liveness canary discovers what to call (config-only repositories, no server)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fake_repository import write_model, write_pipeline
from tritonforge.canary import canary_models, request_body
from tritonforge.deploy.gpu_check import onnx_encoders
from tritonforge.deploy.names import manifest_name_findings
from tritonforge.pipelines import from_repository

ADAPTER = 'q: rate(x{{model=~"{regex}"}}[2m]) / rate(y{{model=~"{regex}"}}[2m])\n'


def repository(tmp_path: Path) -> Path:
    repo = tmp_path / "model_repository"
    write_pipeline(repo, "embed", "", task="embedding")  # the default pipeline's unprefixed stages
    write_pipeline(repo, "classify", "classify_")
    return repo


def manifest(tmp_path: Path, text: str) -> Path:
    deploy = tmp_path / "deploy"
    (deploy / "k8s").mkdir(parents=True, exist_ok=True)
    (deploy / "schemas").mkdir(exist_ok=True)
    (deploy / "schemas" / "vendored.json").write_text('{"x": "/v2/models/nothing/infer"}')
    (deploy / "k8s" / "rules.yaml").write_text(text)
    return deploy


def test_an_encoder_selector_must_cover_every_pipelines_encoders(tmp_path: Path) -> None:
    repo = repository(tmp_path)
    old = manifest(tmp_path, ADAPTER.format(regex="encoder_.*"))
    [finding] = manifest_name_findings(repo, old)
    assert "selects some encoder models but not" in finding
    assert "classify_encoder_fp32" in finding and "classify_encoder_int8" in finding
    assert (
        manifest_name_findings(repo, manifest(tmp_path, ADAPTER.format(regex="(.+_)?encoder_.+")))
        == []
    )
    wide = manifest_name_findings(repo, manifest(tmp_path, ADAPTER.format(regex=".*_.*")))
    assert any("tokenizer" in f for f in wide)  # matches part of the tokenizers: named
    none = manifest_name_findings(repo, manifest(tmp_path, ADAPTER.format(regex="enc")))
    assert none and "matches no model" in none[0]


def test_a_model_path_in_a_manifest_must_exist(tmp_path: Path) -> None:
    repo = repository(tmp_path)
    probe = manifest(tmp_path, "url: http://127.0.0.1:8000/v2/models/embed/infer\n")
    assert manifest_name_findings(repo, probe) == []  # vendored schemas are not manifests
    stale = manifest(tmp_path, "url: http://127.0.0.1:8000/v2/models/embedding/infer\n")
    assert manifest_name_findings(repo, stale) == [
        "rules.yaml: /v2/models/embedding/ is not a model of model_repository"
    ]
    assert manifest_name_findings(tmp_path / "missing", stale) == []  # not exported: no check


def test_the_canary_calls_each_pipelines_fp32_ensemble_and_bls(tmp_path: Path) -> None:
    found = from_repository(repository(tmp_path))
    assert [m for _, m in canary_models(found)] == [
        "classify",
        "classify_bls",
        "embed",
        "embed_bls",
    ]
    body = request_body(found["classify"]).decode()
    assert '"name": "text"' in body and '"name": "probabilities"' in body
    assert json.loads(body)["parameters"] == {"priority": 1}  # canaries jump the bulk queue


def test_gpu_check_defaults_to_the_discovered_onnx_encoders(tmp_path: Path) -> None:
    repo = repository(tmp_path)
    for name in ("encoder_fp32", "classify_encoder_int8"):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.onnx").write_bytes(b"")
    write_model(repo, "other", "x", "ensemble", variant="fp32")
    (repo / "other" / "1").mkdir()
    (repo / "other" / "1" / "model.onnx").write_bytes(b"")  # not an encoder: not checked
    assert onnx_encoders(repo) == ["classify_encoder_int8", "encoder_fp32"]
