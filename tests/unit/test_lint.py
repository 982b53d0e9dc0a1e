"""runtime.launcher.lint on generated pipelines (stand-in encoders), each broken by one rule."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tritonforge.export.tritonconfig import render_pbtxt
from tritonforge.modelconfig import pbtxt_to_dict
from tritonforge.runtime.launcher.lint import lint_repository


@pytest.fixture
def repo(embed_repo: Path) -> Path:
    return embed_repo


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new))


def edit_config(repo: Path, model: str, change: Callable[[dict[str, Any]], None]) -> None:
    """Apply ``change`` to the JSON form of ``model``'s config and write it back."""
    path = repo / model / "config.pbtxt"
    config = pbtxt_to_dict(path.read_text())
    change(config)
    path.write_text(render_pbtxt(config))


def set_param(key: str, value: str) -> Callable[[dict[str, Any]], None]:
    def change(config: dict[str, Any]) -> None:
        config["parameters"][key] = {"string_value": value}

    return change


def only(problems: list[str], needle: str) -> None:
    assert problems, "lint found nothing"
    assert any(needle in p for p in problems), problems


def test_valid_repository_is_clean(repo: Path) -> None:
    assert lint_repository(repo) == []


def test_config_that_does_not_parse(repo: Path) -> None:
    (repo / "tokenizer" / "config.pbtxt").write_text("name: 'tokenizer'\nmax_batch_size: {\n")
    only(lint_repository(repo), "tokenizer: ")
    only(lint_repository(repo), "does not parse")


def test_name_differs_from_directory(repo: Path) -> None:
    edit(repo / "tokenizer" / "config.pbtxt", 'name: "tokenizer"', 'name: "tok"')
    only(lint_repository(repo), "differs from its directory 'tokenizer'")


def test_missing_encoder_says_run_make_export(repo: Path) -> None:
    shutil.rmtree(repo / "encoder_int8")
    problems = lint_repository(repo)
    # the int8 ensemble's one step is the fused model, which names the encoder it runs
    only(problems, "fused_int8: parameters.encoder_models[int8] target model 'encoder_int8'")
    only(problems, "embed_bls: parameters.encoder_models[int8] target model 'encoder_int8'")


def test_missing_artifact(repo: Path) -> None:
    (repo / "encoder_fp32" / "1" / "model.onnx").unlink()
    (repo / "tokenizer" / "1" / "tokenizer.json").unlink()
    problems = lint_repository(repo)
    only(problems, "encoder_fp32: model.onnx is missing from 1/ (run `make export`)")
    only(problems, "tokenizer: tokenizer.json is missing")


def test_ensemble_maps_unknown_input(unfused_repo: Path) -> None:
    repo = unfused_repo

    def rename(config: dict[str, Any]) -> None:
        step = config["ensemble_scheduling"]["step"][1]
        step["input_map"]["ids"] = step["input_map"].pop("input_ids")

    edit_config(repo, "embed", rename)
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


def test_ensemble_output_not_produced(unfused_repo: Path) -> None:
    repo = unfused_repo

    def rename(config: dict[str, Any]) -> None:
        config["ensemble_scheduling"]["step"][1]["output_map"]["sentence_embedding"] = "emb"

    edit_config(repo, "embed", rename)
    only(lint_repository(repo), "embed: ensemble output 'embedding' is produced by no step")


def test_ensemble_unknown_output_of_step(unfused_repo: Path) -> None:
    repo = unfused_repo

    def rename(config: dict[str, Any]) -> None:
        out = config["ensemble_scheduling"]["step"][1]["output_map"]
        out["x"] = out.pop("sentence_embedding")

    edit_config(repo, "embed_int8", rename)
    only(lint_repository(repo), "embed_int8: step 'encoder_int8' has no output 'x'")


def test_bls_target_missing(repo: Path) -> None:
    edit_config(repo, "embed_bls", set_param("tokenizer_model", "tk"))
    only(lint_repository(repo), "embed_bls: parameters.tokenizer_model target model 'tk'")


def test_bls_encoder_output_must_match_bls_output(repo: Path) -> None:
    edit(repo / "encoder_int8" / "config.pbtxt", "dims: [ 384 ]", "dims: [ 128 ]")
    only(
        lint_repository(repo),
        "embed_bls: 'embed_bls' variant 'int8': 'encoder_int8' output 'sentence_embedding' is "
        "TYPE_FP32 [128], 'embed_bls' returns TYPE_FP32 [384]",
    )


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
    edit_config(repo, "embed_bls", set_param("default_variant", "fp16"))
    only(lint_repository(repo), "default_variant 'fp16' is not one of")


def test_tokenizer_outputs_must_match_encoder_inputs(repo: Path) -> None:
    def rename(config: dict[str, Any]) -> None:
        config["output"][2]["name"] = "segment_ids"

    edit_config(repo, "tokenizer", rename)
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
