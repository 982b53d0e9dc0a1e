"""The fused first step without a server: its generated configs and :class:`FusedRunner` against
the two-step path it replaces (tokenizer model's split, then one encoder call per request)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from tests.unit.conftest import stand_in_repo
from tritonforge.batching import infer_trimmed
from tritonforge.bls import build_plan
from tritonforge.errors import ModelConfigError
from tritonforge.export.pipeline_configs import write_pipeline
from tritonforge.export.pipeline_spec import PipelineSpec
from tritonforge.fused import (
    ENCODER_DIGEST_KEY,
    FusedRunner,
    Member,
    check_digest,
    encoder_graph,
)
from tritonforge.integrity import sha256_file, write_sidecar
from tritonforge.modelconfig import ModelConfig
from tritonforge.repository import load_model_config
from tritonforge.runtime.launcher.lint import lint_repository
from tritonforge.text import TextTokenizer, split_tokens
from tritonforge.triton import pad_values_from

AXES = {
    "input_ids": ["batch", "sequence"],
    "attention_mask": ["batch", "sequence"],
    "token_type_ids": ["batch", "sequence"],
    "sentence_embedding": ["batch", None],
}
TEXTS = [
    ["a short one"],
    ["a sentence with quite a few more words in it than the first one had", "x"],
    ["another short one", "and one more, a little longer than that"],
    [" ".join(["long"] * 40)],
]


def steps(repo: Path, ensemble: str) -> list[str]:
    config = load_model_config(repo, ensemble)
    return [str(s["model_name"]) for s in config.raw["ensemble_scheduling"]["step"]]


def test_onnx_variants_run_one_fused_step_and_torchscript_keeps_its_chain(
    embed_repo: Path, embed_spec: PipelineSpec
) -> None:
    names = embed_spec.names
    assert steps(embed_repo, "embed") == [names.fused("fp32")]
    assert steps(embed_repo, "embed_int8") == [names.fused("int8")]
    assert steps(embed_repo, "embed_torchscript") == ["tokenizer", "encoder_torchscript"]
    fused = load_model_config(embed_repo, names.fused("fp32"))
    ensemble = load_model_config(embed_repo, "embed")
    assert [(t.name, t.data_type, t.dims) for t in fused.outputs] == [
        (t.name, t.data_type, t.dims) for t in ensemble.outputs
    ]
    assert fused.parameters["encoder_models"] == "fp32=encoder_fp32"
    assert fused.parameters["tokenizer_model"] == "tokenizer"
    # batching and instances are the encoder's, as its spec declares them
    serving = embed_spec.encoder.serving
    assert serving is not None
    assert int(fused.raw["dynamic_batching"].get("max_queue_delay_microseconds", 0)) == (
        serving.max_queue_delay_us
    )
    assert fused.raw["instance_group"][0]["count"] == serving.instance_count
    assert lint_repository(embed_repo) == []
    assert set(embed_spec.model_names()) == {p.name for p in embed_repo.iterdir() if p.is_dir()}


def test_no_fused_model_when_the_spec_turns_it_off(
    tmp_path: Path, embed_spec: PipelineSpec
) -> None:
    spec = dataclasses.replace(embed_spec, fused=False)
    repo = stand_in_repo(tmp_path / "repo", spec)
    assert steps(repo, "embed") == ["tokenizer", "encoder_fp32"]
    assert not list(repo.glob("fused_*"))
    assert spec.fused_variants() == ()


def test_the_fused_model_follows_the_encoders_version_digest_and_cache(
    tmp_path: Path, embed_spec: PipelineSpec
) -> None:
    spec = dataclasses.replace(embed_spec, response_cache=True)
    repo = stand_in_repo(tmp_path / "repo", spec)
    assert (repo / "fused_fp32" / "1" / "model.py").is_file()
    assert load_model_config(repo, "fused_fp32").raw["response_cache"]["enable"] is True
    assert ENCODER_DIGEST_KEY not in load_model_config(repo, "fused_fp32").parameters
    # a new encoder version (with its sidecar): a new fused version naming its graph's digest
    (repo / "encoder_fp32" / "2").mkdir()
    graph = repo / "encoder_fp32" / "2" / "model.onnx"
    graph.write_bytes(b"version two")
    write_sidecar(graph)
    assert "fused_fp32/2/model.py" in write_pipeline(spec, repo)
    config = load_model_config(repo, "fused_fp32")
    assert config.parameters[ENCODER_DIGEST_KEY] == sha256_file(graph)
    plan = build_plan(config, repo)
    found = encoder_graph(plan, repo)
    assert found.path == graph
    check_digest(config, found, sha256_file(graph))
    with pytest.raises(ModelConfigError, match="re-run `make export`"):
        check_digest(config, found, sha256_file(repo / "encoder_fp32" / "1" / "model.onnx"))


def test_a_fused_model_refuses_an_encoder_onnx_runtime_does_not_serve(embed_repo: Path) -> None:
    config = load_model_config(embed_repo, "fused_fp32")
    path = embed_repo / "encoder_fp32" / "config.pbtxt"
    path.write_text(path.read_text().replace('"onnxruntime"', '"pytorch"'))
    with pytest.raises(ModelConfigError, match="runs only onnxruntime graphs"):
        encoder_graph(build_plan(config, embed_repo), embed_repo)
    assert any("fused_fp32: " in p and "onnxruntime" in p for p in lint_repository(embed_repo))


def fake_graph(calls: list[tuple[int, ...]]):  # type: ignore[no-untyped-def]
    """A stand-in graph whose row answer depends only on the row's unpadded tokens."""

    def run(feed: dict[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        calls.append(feed["input_ids"].shape)
        ids, mask = feed["input_ids"], feed["attention_mask"]
        total = (ids * mask).sum(axis=1, keepdims=True).astype(np.float32)
        width = np.arange(1, 385, dtype=np.float32)
        return {"sentence_embedding": np.sin(total * width / 1000.0)}

    return run


def runner(repo: Path, calls: list[tuple[int, ...]]) -> FusedRunner:
    config = load_model_config(repo, "fused_fp32")
    plan = build_plan(config, repo)
    s = plan.tokenizer
    tokenizer = TextTokenizer(
        s.path, s.max_length, s.pad_to_multiple_of, outputs=s.outputs, pad_id=s.pad_id
    )
    return FusedRunner(plan, encoder_graph(plan, repo), tokenizer, fake_graph(calls), AXES, False)


def test_fused_answers_are_the_two_step_paths_with_one_call_per_shape(embed_repo: Path) -> None:
    calls: list[tuple[int, ...]] = []
    fused = runner(embed_repo, calls)
    members = [Member(i, texts) for i, texts in enumerate(TEXTS)]
    answers = dict(fused.answer(members))
    # the two-step path: the tokenizer model's split, each request its own encoder call
    encoder = ModelConfig.from_json(load_model_config(embed_repo, "encoder_fp32").raw)
    pads = pad_values_from(encoder)
    run = fake_graph([])
    for i, texts in enumerate(TEXTS):
        [tokens] = split_tokens(fused.tokenizer.encode(texts), [len(texts)], pad_to_multiple_of=16)
        expected = infer_trimmed(tokens, run, pads, AXES)["sentence_embedding"]
        assert set(answers[i]) == {"embedding"}
        np.testing.assert_array_equal(answers[i]["embedding"], expected)
    # requests 0 and 2 tokenize to the same 16-token bucket: one call for both
    shapes = {
        split_tokens(fused.tokenizer.encode(t), [len(t)], pad_to_multiple_of=16)[0][
            "input_ids"
        ].shape[1]
        for t in TEXTS
    }
    assert len(calls) == len(shapes) < len(TEXTS)


def test_a_failing_call_fails_only_its_own_requests(embed_repo: Path) -> None:
    calls: list[tuple[int, ...]] = []
    fused = runner(embed_repo, calls)
    healthy = fused._run

    def run(feed: dict[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        if feed["input_ids"].shape[1] > 32:
            raise RuntimeError("graph failed")
        return healthy(feed)

    fused._run = run
    answers = dict(fused.answer([Member(i, t) for i, t in enumerate(TEXTS)]))
    assert isinstance(answers[3], RuntimeError)
    assert all(isinstance(answers[i], dict) for i in (0, 2))
