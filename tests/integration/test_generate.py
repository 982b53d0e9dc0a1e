"""The decoupled ``generate`` model on the real embedded Triton: gRPC streaming and HTTP SSE,
served greedy parity with PyTorch ``generate`` (tokens recorded by the export), batching
invariance, cancellation, overload, limits. Generations are a few tokens long."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import PIPELINE_REPOSITORY, ServeFn
from tritonforge.client.errors import InvalidRequestError, ServerUnavailableError
from tritonforge.client.generate import AsyncGenerateClient, GenerateClient
from tritonforge.modelconfig import ModelConfig
from tritonforge.runtime.serving import EmbeddedServer

pytestmark = pytest.mark.integration


def _fp32_model() -> str:
    """The fp32 variant's model (exact parity with PyTorch), whichever variant is the default."""
    from tritonforge.pipelines import generator_from_repository

    try:
        return generator_from_repository(PIPELINE_REPOSITORY).model("fp32")
    except (LookupError, OSError):
        return "generate"  # not exported yet: the fixtures say so


FP32_MODEL = _fp32_model()
MODEL_DIR = PIPELINE_REPOSITORY / FP32_MODEL
PROMPTS = ("What is the capital of France?", "Name a color.", "Count to three.", "Hi")


def _config() -> ModelConfig:
    return ModelConfig.from_pbtxt((MODEL_DIR / "config.pbtxt").read_text())


def _report() -> dict:
    return json.loads((MODEL_DIR / "1" / "export_report.json").read_text())


def grpc_client(server: EmbeddedServer) -> GenerateClient:
    return GenerateClient(server.grpc_url, protocol="grpc", timeout_s=120, model=FP32_MODEL)


def http_client(server: EmbeddedServer) -> GenerateClient:
    return GenerateClient(server.http_url, protocol="http", timeout_s=120, model=FP32_MODEL)


def test_grpc_and_sse_stream_the_same_greedy_text(pipeline_server: EmbeddedServer) -> None:
    g, h = grpc_client(pipeline_server), http_client(pipeline_server)
    chunks = list(g.stream(PROMPTS[0], max_tokens=6, temperature=0))
    assert chunks[-1].finish_reason == "length"
    assert all(c.finish_reason is None for c in chunks[:-1])  # exactly one final
    sse = list(h.stream(PROMPTS[0], max_tokens=6, temperature=0))
    assert sse[-1].finish_reason == "length"
    assert "".join(c.text for c in chunks) == "".join(c.text for c in sse)
    assert len([c for c in chunks if c.text]) >= 2  # streamed, not one blob


def test_served_greedy_output_matches_pytorch_generate(pipeline_server: EmbeddedServer) -> None:
    """PyTorch ``generate`` tokens are recorded by the export; decode the first 8 and compare."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(MODEL_DIR / "1" / "tokenizer.json"))
    reference = _report()["fidelity"]["reference"][:2]
    with grpc_client(pipeline_server) as c:
        for ref in reference:
            n = min(8, len(ref["tokens"]))
            want = tokenizer.decode(ref["tokens"][:n], skip_special_tokens=True)
            got = c.generate(ref["prompt"], stream=False, max_tokens=n)
            assert got == want, ref["prompt"]


def test_batching_invariance_concurrent_streams(pipeline_server: EmbeddedServer) -> None:
    prompts = [p * (1 + i % 3) for i, p in enumerate(PROMPTS * 2)]  # 8 mixed lengths
    c = grpc_client(pipeline_server)
    alone = [c.generate(p, stream=False, max_tokens=5) for p in prompts[:3]]
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(lambda p: c.generate(p, stream=False, max_tokens=5), prompts))
    assert together[:3] == alone


def test_streams_under_load_carry_every_token_in_order(pipeline_server: EmbeddedServer) -> None:
    """8 concurrent streams (the stream interval sends several tokens per response when many
    rows run: config ``stream_interval_*``) over gRPC and SSE give each prompt the text it gets
    alone, with exactly one final response."""
    prompts = [p * (1 + i % 3) for i, p in enumerate(PROMPTS * 2)]
    g, h = grpc_client(pipeline_server), http_client(pipeline_server)
    alone = [g.generate(p, stream=False, max_tokens=12) for p in prompts]
    for c in (g, h):
        with ThreadPoolExecutor(len(prompts)) as pool:
            streams = list(pool.map(lambda p, c=c: list(c.stream(p, max_tokens=12)), prompts))
        for chunks, want in zip(streams, alone, strict=True):
            assert "".join(x.text for x in chunks) == want
            assert [x.finish_reason is not None for x in chunks].count(True) == 1
            assert chunks[-1].finish_reason in ("length", "stop")


def test_async_iterators_over_both_protocols(pipeline_server: EmbeddedServer) -> None:
    async def collect(url: str, protocol: str) -> tuple[str, str | None]:
        c = AsyncGenerateClient(url, protocol=protocol, timeout_s=120)
        text = "".join([chunk async for chunk in c.generate(PROMPTS[1], max_tokens=4)])
        return text, c.last_finish_reason

    grpc_text, grpc_reason = asyncio.run(collect(pipeline_server.grpc_url, "grpc"))
    http_text, http_reason = asyncio.run(collect(pipeline_server.http_url, "http"))
    assert grpc_text == http_text and grpc_text
    assert grpc_reason == http_reason == "length"


def test_seeded_sampling_reproduces_and_stop_strings_end_the_stream(
    pipeline_server: EmbeddedServer,
) -> None:
    c = http_client(pipeline_server)
    args = {"max_tokens": 6, "temperature": 0.9, "top_p": 0.9, "top_k": 40, "seed": 1234}
    assert c.generate(PROMPTS[2], stream=False, **args) == c.generate(
        PROMPTS[2], stream=False, **args
    )
    full = c.generate(PROMPTS[0], stream=False, max_tokens=8)
    word = full.split()[1]
    cut = c.generate(PROMPTS[0], stream=False, max_tokens=8, stop=[word])
    assert c.last_finish_reason == "stop" and cut == full[: full.index(word)]
    raw = c.generate("The sky is", stream=False, max_tokens=3, chat_template=False)
    assert raw and raw != c.generate("The sky is", stream=False, max_tokens=3)


def test_limits_give_clear_errors_on_both_protocols(pipeline_server: EmbeddedServer) -> None:
    limit = _config().param("max_new_tokens_limit", kind=int)
    max_prompt = _config().param("max_prompt_tokens", kind=int)
    for c in (grpc_client(pipeline_server), http_client(pipeline_server)):
        with pytest.raises(InvalidRequestError, match="max_tokens"):
            c.generate("hi", stream=False, max_tokens=limit + 1)
        with pytest.raises(InvalidRequestError, match=r"text_input.*max_prompt_tokens"):
            c.generate("word " * (max_prompt + 10), stream=False, max_tokens=1)
        with pytest.raises(InvalidRequestError, match="temperature"):
            c.generate("hi", stream=False, temperature=-1)


def _gauge(server: EmbeddedServer, what: str, model: str = "generate") -> float:
    """``model``'s gauge (each decoder variant is its own model with its own gauge)."""
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read()
    m = re.search(
        rf'^tritonforge_generate_{what}_sequences\{{[^}}]*model="{model}"[^}}]*\}} (\S+)$',
        text.decode(),
        re.M,
    )
    assert m, f"gauge tritonforge_generate_{what}_sequences missing from /metrics"
    return float(m.group(1))


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_cancellation_frees_the_slot(pipeline_server: EmbeddedServer, protocol: str) -> None:
    url = pipeline_server.grpc_url if protocol == "grpc" else pipeline_server.http_url
    c = GenerateClient(url, protocol=protocol, timeout_s=120)
    stream = c.stream("Write a long story about a dragon and a knight.", max_tokens=400)
    got = [next(stream) for _ in range(2)]
    assert all(chunk.finish_reason is None for chunk in got)
    # The gauge is set by the scheduler thread once per step: allow it a moment.
    seen = time.monotonic() + 5
    while _gauge(pipeline_server, "running") < 1:
        assert time.monotonic() < seen, "a streaming sequence is not counted as running"
        time.sleep(0.05)
    stream.close()  # gRPC: stop_stream(cancel_requests=True); HTTP: connection closed
    deadline = time.monotonic() + 30
    while _gauge(pipeline_server, "running") > 0:
        assert time.monotonic() < deadline, "the cancelled sequence still holds its slot"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def tight_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The generate model alone with 1 running slot and a queue of 1 (artifacts linked)."""
    repo = tmp_path_factory.mktemp("tight")
    dst = repo / FP32_MODEL
    shutil.copytree(MODEL_DIR, dst, symlinks=False, copy_function=_link)
    text = (MODEL_DIR / "config.pbtxt").read_text()
    for key in ("max_running", "max_queue"):
        text = re.sub(rf'(key: "{key}" value: {{ string_value: )"\d+"', r'\1"1"', text)
    (dst / "config.pbtxt").unlink()
    (dst / "config.pbtxt").write_text(text)
    return repo


def _link(src: str, dst: str) -> None:
    Path(dst).symlink_to(Path(src).resolve())


def test_overload_is_unavailable_and_nothing_hangs(serve: ServeFn, tight_repo: Path) -> None:
    server = serve(tight_repo)
    c = grpc_client(server)
    results: list[object] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        try:
            out: object = c.generate(f"{PROMPTS[0]} {i}", stream=False, max_tokens=12)
        except ServerUnavailableError as e:
            out = e
        with lock:
            results.append(out)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert not any(t.is_alive() for t in threads), "a request hung"
    refused = [r for r in results if isinstance(r, ServerUnavailableError)]
    served = [r for r in results if isinstance(r, str)]
    assert refused and served and len(refused) + len(served) == 5
    assert "overloaded" in str(refused[0])


def test_cli_streams_tokens_and_prints_json(pipeline_server: EmbeddedServer) -> None:
    import subprocess
    import sys

    from tests.conftest import PROJECT_ROOT

    base = [sys.executable, "-m", "tritonforge.client", "generate", PROMPTS[0], "--max-tokens", "4"]
    streamed = subprocess.run(
        [*base, "--stream", "--protocol", "grpc", "--url", pipeline_server.grpc_url],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    plain = subprocess.run(
        [*base, "--protocol", "http", "--url", pipeline_server.http_url],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    result = json.loads(plain.stdout)
    assert result["finish_reason"] == "length"
    assert streamed.stdout.strip() == result["text"].strip() != ""
    bad = subprocess.run(
        [*base[:-1], "100000", "--url", pipeline_server.http_url],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 1 and "max_tokens" in bad.stderr
