"""The decoder export's families: read from the checkpoint's config, an unsupported family
refused early with the supported ones named, the builder's config adapter, the prompt's bos."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tritonforge.export.errors import SpecError
from tritonforge.generation import with_bos
from tritonforge.tasks.generation.export.families import FAMILIES, family_of
from tritonforge.tasks.generation.export.genai_builder import adapt_config
from tritonforge.tasks.generation.export.pretrained import check_name, decoder_from_pretrained


def _config_dir(tmp_path: Path, **config: object) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_an_unsupported_family_fails_before_any_weight_naming_the_supported(
    tmp_path: Path,
) -> None:
    # a config alone (no weights): the family check reads nothing else
    d = _config_dir(tmp_path, model_type="gpt2", n_layer=2, n_embd=32, n_head=2, vocab_size=64)
    with pytest.raises(SpecError) as e:
        decoder_from_pretrained(d, "mine")
    message = str(e.value)
    assert "'gpt2' is not a supported decoder family" in message
    for model_type, architecture in FAMILIES.items():
        assert model_type in message and architecture in message


def test_the_spec_takes_its_limits_from_the_checkpoint(tmp_path: Path) -> None:
    d = _config_dir(
        tmp_path,
        model_type="qwen2",
        architectures=["Qwen2ForCausalLM"],
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        vocab_size=100,
        max_position_embeddings=256,
    )
    spec = decoder_from_pretrained(d, "mine", fidelity_prompts=3)
    assert spec.serving.model_name == "mine" and spec.name == "mine"
    assert spec.source == d.resolve() and spec.fidelity_prompts == 3
    assert spec.serving.max_prompt_tokens == 128  # half the context
    assert spec.serving.max_new_tokens_limit == 128
    assert "qwen2" in spec.description


def test_a_missing_checkpoint_says_what_it_needs(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="not a checkpoint directory"):
        decoder_from_pretrained(tmp_path / "nope.bin", "mine")


@pytest.mark.parametrize("name", ["Mine", "1abc", "a-b", ""])
def test_served_names_are_identifiers(name: str) -> None:
    with pytest.raises(SpecError, match="--name"):
        check_name(name)


def test_long_context_phi3_is_refused() -> None:
    from transformers import Phi3Config

    config = Phi3Config(max_position_embeddings=8192, original_max_position_embeddings=4096)
    with pytest.raises(SpecError, match="LongRoPE"):
        family_of(config, "phi")
    assert family_of(Phi3Config(original_max_position_embeddings=4096), "phi") == "phi3"


def test_gemma3_rotary_settings_are_flattened_for_the_builder() -> None:
    from transformers import Gemma3TextConfig, LlamaConfig

    config = adapt_config(Gemma3TextConfig(hidden_size=32, num_hidden_layers=2))
    assert config.rope_parameters["rope_type"] == "default"
    assert config.rope_theta == 1_000_000.0  # global layers
    assert config.rope_local_base_freq == 10_000.0  # sliding-window layers
    llama = LlamaConfig(hidden_size=32, num_hidden_layers=1)
    before = dict(llama.rope_parameters)
    assert adapt_config(llama).rope_parameters == before  # flat already: unchanged


def test_bos_is_put_first_once() -> None:
    assert with_bos([5, 6], 1) == [1, 5, 6]
    assert with_bos([1, 5], 1) == [1, 5]  # the template wrote it
    assert with_bos([5, 6], None) == [5, 6]  # the tokenizer adds none
    assert with_bos([], 1) == []  # an empty prompt stays empty (refused as such)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--gguf", "m.gguf", "--task", "embedding", "--name", "m"],
            "--gguf takes --task generation",
        ),
        (["--gguf", "m.gguf", "--task", "generation"], "needs --name"),
        (["--from-pretrained", "d", "--gguf", "m.gguf", "--task", "generation"], "give one of"),
        (["--gguf", "m.gguf"], "needs --task"),
    ],
)
def test_cli_checks_the_decoder_options(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from tritonforge.export.cli import parse_args

    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err


def test_cli_refuses_an_unsupported_family_naming_the_supported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tritonforge.export.cli import main

    d = _config_dir(tmp_path / "ckpt", model_type="gpt2", n_layer=1, n_embd=32, n_head=2)
    repo = tmp_path / "repo"
    argv = ["--from-pretrained", str(d), "--task", "generation", "--name", "mine"]
    assert main([*argv, "--model-repository", str(repo)]) == 1
    assert "'gpt2' is not a supported decoder family" in caplog.text
    assert "gemma3_text (Gemma3ForCausalLM)" in caplog.text
    assert not repo.exists()  # nothing written


def test_a_family_tolerance_comes_from_the_families_table(tmp_path: Path) -> None:
    from tritonforge.tasks.generation.export.families import LOGITS_TOLERANCE

    sizes = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
    gemma = _config_dir(tmp_path / "g", model_type="gemma3_text", **sizes)
    llama = _config_dir(tmp_path / "l", model_type="llama", **sizes)
    got = decoder_from_pretrained(gemma, "g")
    assert (got.logits_atol, got.logits_rtol) == LOGITS_TOLERANCE["gemma3_text"]
    assert decoder_from_pretrained(llama, "l").logits_atol == 1e-2  # the spec's default


def test_the_genai_builder_stamps_its_version_without_the_checkouts_git_head() -> None:
    """Unpatched, a venv inside a git checkout gave ``0.18.0+<HEAD>``: one decoder sha256 per
    checkout and commit."""
    import importlib
    from importlib import metadata

    import onnx_ir as ir

    from tritonforge.tasks.generation.export.genai_builder import deterministic_stamp

    deterministic_stamp()
    model = ir.Model(ir.Graph([], [], nodes=[]), ir_version=10)
    importlib.import_module("builders.base").Model.stamp_build_metadata(model)
    assert model.producer_version == metadata.version("onnxruntime-genai")
