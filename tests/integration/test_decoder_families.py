"""Any supported causal-LM family, end to end: tiny random Llama, Mistral, Qwen2, Qwen3,
Gemma 3 and Phi-3 checkpoints (built here by transformers, tests/tiny_decoders.py) exported
by ``tritonforge export --from-pretrained DIR --task generation`` (logits on the grid, greedy fidelity, batch invariance;
int8 and its gate for one of them), served side by side by one embedded Triton, and their
greedy output compared with transformers' ``generate`` on the same checkpoint over gRPC
streaming, SSE and the OpenAI ``/v1`` routes. Qwen3's checkpoint has no chat template: it serves
completions, and ``/v1/chat/completions`` answers 400 saying so."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests import tiny_decoders
from tritonforge.client.generate import GenerateClient
from tritonforge.runtime.launcher.settings import ServerSettings
from tritonforge.runtime.serving import EmbeddedServer

pytestmark = pytest.mark.integration
FAMILIES = tiny_decoders.FAMILIES
NO_CHAT = "qwen3"  # exported without a chat template
WITH_INT8 = "llama"  # exported with int8 too (served as <name>, fp32 as <name>_fp32)
PROMPT = "What is the capital of France?"
NEW_TOKENS = 12


def served_name(family: str) -> str:
    return f"tiny_{family}"


@pytest.fixture(scope="session")
def family_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("decoders")
    return {f: tiny_decoders.decoder(root / f, f, chat=f != NO_CHAT) for f in FAMILIES}


@pytest.fixture(scope="session")
def family_repository(
    tmp_path_factory: pytest.TempPathFactory, family_checkpoints: dict[str, Path]
) -> Path:
    """Every tiny decoder exported into one repository by the CLI (~20 s each)."""
    from tritonforge.export.cli import main
    from tritonforge.tasks.generation.export import steps

    repo = tmp_path_factory.mktemp("decoder_repo") / "model_repository"
    with pytest.MonkeyPatch.context() as mp:  # the references' cache, not the checkout's build/
        mp.setattr(steps, "REFERENCE_CACHE", tmp_path_factory.mktemp("reference-cache"))
        for family, directory in family_checkpoints.items():
            argv = ["--from-pretrained", str(directory), "--task", "generation"]
            argv += ["--name", served_name(family), "--model-repository", str(repo)]
            code = main([*argv, "--quantize", "int8" if family == WITH_INT8 else "none"])
            assert code == 0, f"export of the tiny {family} failed"
    return repo


@pytest.fixture(scope="session")
def family_server(family_repository: Path) -> Iterator[EmbeddedServer]:
    with EmbeddedServer(ServerSettings.ephemeral(family_repository)) as server:
        yield server


def _fp32_model(family: str) -> str:
    return served_name(family) + ("_fp32" if family == WITH_INT8 else "")


def _report(repo: Path, family: str) -> dict[str, Any]:
    path = repo / _fp32_model(family) / "1" / "export_report.json"
    return dict(json.loads(path.read_text()))


def transformers_greedy(directory: Path, chat: bool) -> str:
    """transformers' greedy continuation of :data:`PROMPT` (the chat template's prompt when the
    checkpoint has one), decoded without special tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    if chat:
        messages = [{"role": "user", "content": PROMPT}]
        ids = tok.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    else:
        ids = tok(PROMPT)["input_ids"]
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0
        )
    return str(tok.decode(out[0, len(ids) :], skip_special_tokens=True))


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_exports_verified(family_repository: Path, family: str) -> None:
    report = _report(family_repository, family)
    assert report["family"] == family
    assert report["parity"]["fp32"]["worst"]["ratio"] <= 1.0
    fidelity = report["fidelity"]
    assert fidelity["identical"] == fidelity["prompts"] > 0
    assert not fidelity["batching_invariance_differences"]
    meta = json.loads(
        (family_repository / _fp32_model(family) / "1" / "generation.json").read_text()
    )
    assert meta["model_type"] == family and meta["prompt_bos_token_id"] == 1
    assert (meta["chat_template"] is None) == (family == NO_CHAT)


def test_int8_is_gated_and_both_names_are_served(family_repository: Path) -> None:
    name = served_name(WITH_INT8)
    default = json.loads((family_repository / name / "1" / "export_report.json").read_text())
    assert default["default"]["models"] == {"fp32": f"{name}_fp32", "int8": name}
    assert default["quantization"]["greedy_agreement"] >= 0.9


@pytest.mark.parametrize("family", FAMILIES)
def test_served_greedy_equals_transformers_over_grpc_sse_and_v1(
    family_server: EmbeddedServer, family_checkpoints: dict[str, Path], family: str
) -> None:
    chat = family != NO_CHAT
    want = transformers_greedy(family_checkpoints[family], chat)
    assert want  # the random model does not stop at once: a real comparison
    model = _fp32_model(family)
    texts = {}
    for protocol, url in (("grpc", family_server.grpc_url), ("http", family_server.http_url)):
        client = GenerateClient(url, protocol=protocol, model=model, timeout_s=120)
        chunks = list(client.stream(PROMPT, max_tokens=NEW_TOKENS, temperature=0))
        texts[protocol] = "".join(c.text for c in chunks)
    route, body = (
        ("chat/completions", {"messages": [{"role": "user", "content": PROMPT}]})
        if chat
        else ("completions", {"prompt": PROMPT})
    )
    r = requests.post(
        f"http://{family_server.http_url}/v1/{route}",
        json={"model": model, "max_tokens": NEW_TOKENS, "temperature": 0, **body},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    texts["v1"] = choice["message"]["content"] if chat else choice["text"]
    assert texts == {"grpc": want, "http": want, "v1": want}


def test_v1_models_lists_every_decoder(family_server: EmbeddedServer) -> None:
    r = requests.get(f"http://{family_server.http_url}/v1/models", timeout=30)
    assert r.status_code == 200, r.text
    ids = {m["id"] for m in r.json()["data"]}
    assert {served_name(f) for f in FAMILIES} <= ids
    assert f"{served_name(WITH_INT8)}_fp32" in ids


def test_chat_without_a_template_is_refused(family_server: EmbeddedServer) -> None:
    r = requests.post(
        f"http://{family_server.http_url}/v1/chat/completions",
        json={"model": served_name(NO_CHAT), "messages": [{"role": "user", "content": "Hi"}]},
        timeout=30,
    )
    assert r.status_code == 400
    assert "no chat template" in r.text and "/v1/completions" in r.text
