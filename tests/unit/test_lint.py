"""runtime.lint on tmp copies of the real model repository, each broken by one rule."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tritonforge.runtime.lint import lint_repository

REPO = Path(__file__).resolve().parents[2] / "model_repository"
PIPELINE = ["tokenizer", "postprocess", "embed", "embed_int8", "embed_torchscript", "embed_bls"]
ONNX_INPUTS = ["input_ids", "attention_mask", "token_type_ids"]


def encoder_config(name: str, backend: str, inputs: list[str], output: str) -> str:
    tensors = ", ".join(f'{{ name: "{n}" data_type: TYPE_INT64 dims: [ -1 ] }}' for n in inputs)
    return (
        f'name: "{name}"\nbackend: "{backend}"\nmax_batch_size: 64\n'
        f"input [ {tensors} ]\n"
        f'output [ {{ name: "{output}" data_type: TYPE_FP32 dims: [ 384 ] }} ]\n'
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """The committed pipeline configs plus stand-in encoders and artifacts (what export writes)."""
    root = tmp_path / "repo"
    for name in PIPELINE:
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("tokenizer.json"))
    (root / "tokenizer" / "1" / "tokenizer.json").write_text("{}")
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
    return root


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new))


def only(problems: list[str], needle: str) -> None:
    assert problems, "lint found nothing"
    assert any(needle in p for p in problems), problems


def test_valid_repository_is_clean(repo: Path) -> None:
    assert lint_repository(repo) == []


def test_config_that_does_not_parse(repo: Path) -> None:
    (repo / "postprocess" / "config.pbtxt").write_text("name: 'postprocess'\nmax_batch_size: {\n")
    only(lint_repository(repo), "postprocess: ")
    only(lint_repository(repo), "does not parse")


def test_name_differs_from_directory(repo: Path) -> None:
    edit(repo / "postprocess" / "config.pbtxt", 'name: "postprocess"', 'name: "post"')
    only(lint_repository(repo), "differs from its directory 'postprocess'")


def test_missing_encoder_says_run_make_export(repo: Path) -> None:
    shutil.rmtree(repo / "encoder_int8")
    problems = lint_repository(repo)
    only(problems, "embed_int8: step model 'encoder_int8' does not exist (run `make export`)")
    only(problems, "encoder_models[int8] target model 'encoder_int8' does not exist")


def test_missing_artifact(repo: Path) -> None:
    (repo / "encoder_fp32" / "1" / "model.onnx").unlink()
    (repo / "tokenizer" / "1" / "tokenizer.json").unlink()
    problems = lint_repository(repo)
    only(problems, "encoder_fp32: model.onnx is missing from 1/ (run `make export`)")
    only(problems, "tokenizer: tokenizer.json is missing")


def test_ensemble_maps_unknown_input(repo: Path) -> None:
    edit(repo / "embed" / "config.pbtxt", 'key: "input_ids"', 'key: "ids"')
    problems = lint_repository(repo)
    only(problems, "embed: step 'encoder_fp32' has no input 'ids'")
    only(problems, "embed: input 'input_ids' of step 'encoder_fp32' is not mapped")


def test_ensemble_dtype_mismatch(repo: Path) -> None:
    edit(
        repo / "encoder_torchscript" / "config.pbtxt",
        'name: "INPUT__1" data_type: TYPE_INT64',
        'name: "INPUT__1" data_type: TYPE_INT32',
    )
    only(
        lint_repository(repo),
        "embed_torchscript: tensor 'attention_mask' is TYPE_INT64 but input 'INPUT__1' of "
        "'encoder_torchscript' wants TYPE_INT32",
    )


def test_ensemble_output_not_produced(repo: Path) -> None:
    edit(repo / "embed" / "config.pbtxt", 'value: "embedding"', 'value: "emb"')
    only(lint_repository(repo), "embed: ensemble output 'embedding' is produced by no step")


def test_ensemble_unknown_output_of_step(repo: Path) -> None:
    edit(repo / "embed_int8" / "config.pbtxt", 'key: "sentence_embedding" value', 'key: "x" value')
    only(lint_repository(repo), "embed_int8: step 'encoder_int8' has no output 'x'")


def test_bls_target_missing(repo: Path) -> None:
    edit(repo / "embed_bls" / "config.pbtxt", 'string_value: "postprocess"', 'string_value: "pp"')
    only(lint_repository(repo), "embed_bls: parameters.postprocess_model target model 'pp'")


def test_bls_variant_chain_does_not_connect(repo: Path) -> None:
    edit(
        repo / "encoder_int8" / "config.pbtxt",
        'name: "token_type_ids" data_type: TYPE_INT64',
        'name: "token_type_ids" data_type: TYPE_INT32',
    )
    only(
        lint_repository(repo),
        "embed_bls: 'embed_bls' variant 'int8': 'token_type_ids' is TYPE_INT64",
    )


def test_bls_default_variant_unknown(repo: Path) -> None:
    edit(repo / "embed_bls" / "config.pbtxt", 'string_value: "fp32" }', 'string_value: "fp16" }')
    only(lint_repository(repo), "default_variant 'fp16' is not one of")


def test_tokenizer_outputs_must_match_encoder_inputs(repo: Path) -> None:
    edit(repo / "tokenizer" / "config.pbtxt", 'name: "token_type_ids"', 'name: "segment_ids"')
    only(
        lint_repository(repo), "tokenizer: input 'token_type_ids' of 'encoder_fp32' is not produced"
    )


def test_cycle(repo: Path) -> None:
    for a, b in [("loop_a", "loop_b"), ("loop_b", "loop_a")]:
        (repo / a / "1").mkdir(parents=True)
        (repo / a / "config.pbtxt").write_text(
            f'name: "{a}"\nbackend: "python"\n'
            f'parameters {{ key: "next_model" value: {{ string_value: "{b}" }} }}\n'
        )
    only(lint_repository(repo), "cycle: loop_a -> loop_b -> loop_a")


def test_missing_repository(tmp_path: Path) -> None:
    only(lint_repository(tmp_path / "nope"), "does not exist")
