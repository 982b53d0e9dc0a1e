"""Generation variants on the real embedded Triton: every exported decoder variant is its own
model (discovered from ``tritonforge.*`` parameters), pinnable per request, with its own metrics;
the served int8 decoder passes its greedy quality gate and answers independently of the batch."""

from __future__ import annotations

import json
import re
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import pytest

from tests.conftest import PIPELINE_REPOSITORY
from tritonforge.client.errors import InvalidRequestError
from tritonforge.client.generate import GenerateClient
from tritonforge.pipelines import Generator, generator_from_repository
from tritonforge.runtime.serving import EmbeddedServer

pytestmark = pytest.mark.integration


@cache
def _group() -> Generator | None:
    try:
        return generator_from_repository(PIPELINE_REPOSITORY)
    except LookupError:
        return None


def group() -> Generator:
    found = _group()
    if found is None:
        why = f"no generation models in {PIPELINE_REPOSITORY} (run `make export`)"
        pytest.skip(reason=why)
    return found


def _model_dir(variant: str) -> Path:
    return PIPELINE_REPOSITORY / group().model(variant)


def _report(variant: str) -> dict:
    return json.loads((_model_dir(variant) / "1" / "export_report.json").read_text())


def _needs_int8() -> None:
    if "int8" not in group().variants:
        pytest.skip(reason="the int8 decoder is not exported (export smollm2 --quantize int8)")


def client(server: EmbeddedServer, variant: str | None = None) -> GenerateClient:
    return GenerateClient(
        server.grpc_url, protocol="grpc", timeout_s=120, model=group().name, variant=variant
    )


def test_each_variant_is_a_model_pinned_by_the_client_and_checked_by_the_model(
    pipeline_server: EmbeddedServer,
) -> None:
    _needs_int8()
    prompt = "Name a color."
    for variant in group().variants:
        c = client(pipeline_server, variant)
        assert c.model == group().model(variant)
        assert c.generate(prompt, stream=False, max_tokens=3)
    # A request that pins another variant than the model serves is refused, naming the field.
    wrong = next(v for v in group().variants if v != group().default_variant)
    plain = GenerateClient(pipeline_server.http_url, protocol="http", model=group().model())
    with pytest.raises(InvalidRequestError, match="variant"):
        plain.generate(prompt, stream=False, max_tokens=2, variant=wrong)
    with pytest.raises(InvalidRequestError, match=r"variant.*int4"):
        client(pipeline_server, "int4")


def _metric(server: EmbeddedServer, family: str, model: str) -> float:
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    m = re.search(rf'^{family}\{{[^}}]*model="{model}"[^}}]*\}} (\S+)$', text, re.M)
    assert m, f"{family} for model {model!r} missing from /metrics"
    return float(m.group(1))


def test_metrics_are_per_variant(pipeline_server: EmbeddedServer) -> None:
    """Triton's per-model counters move only for the variant that served the request."""
    _needs_int8()
    counter = "nv_inference_request_success"
    before = {v: _metric(pipeline_server, counter, group().model(v)) for v in group().variants}
    client(pipeline_server, "int8").generate("Hi", stream=False, max_tokens=2)
    after = {v: _metric(pipeline_server, counter, group().model(v)) for v in group().variants}
    assert after["int8"] == before["int8"] + 1
    assert after["fp32"] == before["fp32"]
    text = urllib.request.urlopen(pipeline_server.metrics_url, timeout=10).read().decode()
    assert 'variant="int8"' in text and "tritonforge_generate_running_sequences" in text


def test_served_int8_greedy_output_is_the_gated_one(pipeline_server: EmbeddedServer) -> None:
    """The export gated int8 on these prompts' greedy tokens (agreement with fp32, perplexity);
    the served int8 model, each prompt alone, must produce exactly those tokens."""
    from tokenizers import Tokenizer

    _needs_int8()
    report = _report("int8")
    q = report["quantization"]
    assert q["greedy_agreement"] >= q["gate"]["min_greedy_agreement"]
    assert q["perplexity"]["ratio"] <= q["gate"]["max_perplexity_ratio"]
    tokenizer = Tokenizer.from_file(str(_model_dir("int8") / "1" / "tokenizer.json"))
    prompts = [r["prompt"] for r in report["fidelity"]["reference"]][:6]
    n = 8
    want = [tokenizer.decode(t[:n], skip_special_tokens=True) for t in q["greedy_tokens"][:6]]
    c = client(pipeline_server, "int8")
    alone = [c.generate(p, stream=False, max_tokens=n) for p in prompts]
    assert alone == want


def test_served_int8_answers_do_not_depend_on_the_batch(pipeline_server: EmbeddedServer) -> None:
    """Issue 20 item 3: 7-10 of 20 int8 prompts' greedy tokens changed inside a batch (a row's
    left padding modulo 4 changes ONNX Runtime's bits, int8's activation quantization amplifies
    them). The export checks 20 prompts alone vs 8 at a time; the served model the same here."""
    _needs_int8()
    q = _report("int8")["quantization"]
    assert not q["batching_invariance_differences"]
    prompts = [r["prompt"] for r in _report("int8")["fidelity"]["reference"]][:8]
    c = client(pipeline_server, "int8")
    alone = [c.generate(p, stream=False, max_tokens=16) for p in prompts]
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(lambda p: c.generate(p, stream=False, max_tokens=16), prompts))
    assert together == alone


@pytest.mark.slow
def test_served_int8_artifacts_pass_the_gate_recomputed() -> None:
    """Teacher-forced greedy agreement with fp32 and held-out perplexity, recomputed from the
    served model directories (configs, sidecar-checked artifacts, serving session options)."""
    from tritonforge.export.specs.smollm2 import smollm2_spec
    from tritonforge.export.specs.text_inputs import read_sentences
    from tritonforge.generate_engine import GenerateEngine
    from tritonforge.modelconfig import ModelConfig
    from tritonforge.tasks.generation.export import verify

    _needs_int8()
    engines = {}
    for v in ("fp32", "int8"):
        config = ModelConfig.from_pbtxt((_model_dir(v) / "config.pbtxt").read_text())
        engines[v] = GenerateEngine(config, _model_dir(v) / "1")
    spec = smollm2_spec()
    q = _report("int8")["quantization"]
    fp32, int8 = engines["fp32"], engines["int8"]
    reference = _report("fp32")["fidelity"]["reference"]
    prompts = [fp32.prompt_ids(r["prompt"], True) for r in reference]
    agree = verify.teacher_forced_agreement(
        int8.decoder, int8.decoder.empty_past, prompts, [r["tokens"] for r in reference]
    )
    rows = [fp32.tokenizer.encode(t).ids for t in read_sentences(spec.perplexity_file)]
    ratio = verify.perplexity(int8.decoder, int8.decoder.empty_past, rows) / verify.perplexity(
        fp32.decoder, fp32.decoder.empty_past, rows
    )
    assert agree >= spec.int8_gate.min_greedy_agreement
    assert ratio <= spec.int8_gate.max_perplexity_ratio
    assert (
        abs(agree - q["greedy_agreement"]) < 1e-9 and abs(ratio - q["perplexity"]["ratio"]) < 1e-4
    )
