"""The OpenAI-compatible /v1 routes on the real embedded Triton, called with the real clients:
the ``openai`` package (sync and async, streaming and not) and LangChain's OpenAI classes
pointed at ``base_url``. Parity: /v1 embeddings equal the ensemble's (1e-6), greedy chat equals
the ``generate`` model's own output token for token."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from tests.conftest import PIPELINE_REPOSITORY, ServeFn
from tritonforge.client.generate import GenerateClient
from tritonforge.client.sync import EmbeddingClient
from tritonforge.generation import render_chat
from tritonforge.pipelines import repository_configs
from tritonforge.runtime.front.openai.catalog import EMBEDDING, GENERATION, catalog
from tritonforge.runtime.serving import EmbeddedServer
from tritonforge.text import served_tokenizer

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.integration
KEY = "not-checked"  # the pipeline server sets no /v1 key
AUTH = {"Authorization": f"Bearer {KEY}"}
TEXTS = ["The cat sat on the mat.", "Triton serves models.", "héllo wörld"]
# A short answer that ends with EOS ("stop") from every served decoder variant (11 tokens, fp32
# and int8; the default is int8, which runs "What is the capital of France?" past 64 tokens).
QUESTION = "What is 2+2?"
LONG = "Explain how a bicycle works."  # runs past a dozen tokens ("length")
CATALOG = catalog(repository_configs(PIPELINE_REPOSITORY))
EMBEDDING_IDS = [m for m, s in CATALOG.items() if s.kind == EMBEDDING]
GENERATOR = next((m for m, s in CATALOG.items() if s.kind == GENERATION), "")


@pytest.fixture(scope="module")
def server(pipeline_server: EmbeddedServer) -> EmbeddedServer:
    """The real repository (no /v1 API key set: any key is accepted)."""
    if not EMBEDDING_IDS or not GENERATOR:
        pytest.fail(f"{PIPELINE_REPOSITORY} serves no embedding or generate model (make export)")
    return pipeline_server


def base_url(server: EmbeddedServer) -> str:
    return f"http://{server.http_url}/v1"


@pytest.fixture(scope="module")
def client(server: EmbeddedServer) -> Any:
    return openai.OpenAI(base_url=base_url(server), api_key=KEY, max_retries=0, timeout=120)


def _generate(server: EmbeddedServer, prompt: str, **sampling: Any) -> tuple[str, str | None]:
    c = GenerateClient(server.grpc_url, protocol="grpc", model=GENERATOR, timeout_s=120)
    text = "".join(ch.text for ch in c.stream(prompt, **sampling))
    return text, c.last_finish_reason


def _gauge(server: EmbeddedServer, name: str, model: str) -> float:
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    m = re.search(rf'^{name}\{{[^}}]*model="{model}"[^}}]*\}} (\S+)$', text, re.M)
    assert m, f"{name} for {model} missing from /metrics"
    return float(m.group(1))


def v2_embeddings(server: EmbeddedServer) -> np.ndarray:
    """The first embedding model's answers to :data:`TEXTS` over v2 (the project's client)."""
    return EmbeddingClient(
        server.http_url,
        "http",
        name=CATALOG[EMBEDDING_IDS[0]].pipeline,
        admin_key=server.settings.admin_key,
    ).embed(TEXTS)


def test_models_lists_what_the_repository_serves(client: Any) -> None:
    ids = [m.id for m in client.models.list()]
    assert ids == sorted(CATALOG)
    assert EMBEDDING_IDS and all("classify" not in m for m in ids)
    assert client.models.retrieve(GENERATOR).id == GENERATOR


@pytest.mark.parametrize("model", EMBEDDING_IDS)
def test_embeddings_equal_the_ensemble(server: EmbeddedServer, client: Any, model: str) -> None:
    served = CATALOG[model]
    v2 = EmbeddingClient(
        server.http_url, "http", name=served.pipeline, admin_key=server.settings.admin_key
    )
    want = v2.embed(TEXTS, variant=served.variant)
    got = client.embeddings.create(model=model, input=TEXTS)  # the client asks for base64
    vectors = np.array([d.embedding for d in got.data], np.float32)
    assert vectors.shape == want.shape
    assert np.abs(vectors - want).max() <= 1e-6
    assert [d.index for d in got.data] == [0, 1, 2]
    tokens = served_tokenizer(PIPELINE_REPOSITORY / served.tokenizer_model).encode(TEXTS)
    assert got.usage.prompt_tokens == int(tokens["attention_mask"].sum())
    floats = client.embeddings.create(model=model, input=TEXTS[0], encoding_format="float")
    # The same request alone (int8's dynamic quantization scales over the batch it is in).
    alone = v2.embed(TEXTS[:1], variant=served.variant)
    assert np.abs(np.array(floats.data[0].embedding) - alone[0]).max() <= 1e-6


def test_async_embeddings(server: EmbeddedServer) -> None:
    async def run() -> list[list[float]]:
        async with openai.AsyncOpenAI(base_url=base_url(server), api_key=KEY) as c:
            results = await asyncio.gather(
                *(c.embeddings.create(model=EMBEDDING_IDS[0], input=t) for t in TEXTS)
            )
        return [r.data[0].embedding for r in results]

    got = np.array(asyncio.run(run()), np.float32)
    want = v2_embeddings(server)
    assert np.abs(got - want).max() <= 1e-6


def test_greedy_chat_equals_the_generate_model(server: EmbeddedServer, client: Any) -> None:
    n = 12
    want, reason = _generate(server, LONG, max_tokens=n, temperature=0)
    got = client.chat.completions.create(
        model=GENERATOR,
        messages=[{"role": "user", "content": LONG}],
        max_tokens=n,
        temperature=0,
    )
    choice = got.choices[0]
    assert choice.message.content == want and choice.finish_reason == reason == "length"
    short, short_reason = _generate(server, QUESTION, max_tokens=64, temperature=0)
    eos = client.chat.completions.create(
        model=GENERATOR, messages=[{"role": "user", "content": QUESTION}], max_tokens=64
    )
    assert eos.choices[0].message.content == short
    assert eos.choices[0].finish_reason == short_reason == "stop"
    assert choice.message.role == "assistant" and got.object == "chat.completion"
    assert got.usage.completion_tokens == n  # the served tokenizer counts what came back
    assert got.usage.total_tokens == got.usage.prompt_tokens + n
    # max_completion_tokens is the same knob; a system message changes the prompt.
    again = client.chat.completions.create(
        model=GENERATOR, messages=[{"role": "user", "content": LONG}], max_completion_tokens=n
    )
    assert again.choices[0].message.content == want  # the model's default is greedy
    messages = [
        {"role": "system", "content": "You answer in French."},
        {"role": "user", "content": LONG},
    ]
    system = client.chat.completions.create(model=GENERATOR, messages=messages, max_tokens=n)
    assert system.usage.prompt_tokens == _prompt_tokens(messages)  # the template, then counted
    assert got.usage.prompt_tokens == _prompt_tokens([{"role": "user", "content": LONG}])


def _prompt_tokens(messages: list[dict[str, str]]) -> int:
    """Tokens of ``messages`` through the served chat template, by the served tokenizer."""
    from tokenizers import Tokenizer

    version = PIPELINE_REPOSITORY / GENERATOR / "1"
    template = json.loads((version / "generation.json").read_text())["chat_template"]
    tokenizer = Tokenizer.from_file(str(version / "tokenizer.json"))
    return len(tokenizer.encode(render_chat(messages, template), add_special_tokens=False).ids)


def test_streaming_chat_sends_chunks_usage_and_done(server: EmbeddedServer, client: Any) -> None:
    n = 10
    whole = client.chat.completions.create(
        model=GENERATOR, messages=[{"role": "user", "content": LONG}], max_tokens=n
    )
    chunks = list(
        client.chat.completions.create(
            model=GENERATOR,
            messages=[{"role": "user", "content": LONG}],
            max_tokens=n,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) >= 2
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == "length" and reasons.count("length") == 1
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == n
    assert all(c.usage is None for c in chunks[:-1])
    raw = requests.post(
        f"{base_url(server)}/chat/completions",
        json={
            "model": GENERATOR,
            "messages": [{"role": "user", "content": "Hi"}],
            "stream": True,
            "max_tokens": 2,
        },
        headers=AUTH,
        timeout=120,
    )
    assert raw.headers["Content-Type"].startswith("text/event-stream")
    assert raw.text.rstrip().endswith("data: [DONE]")


def test_async_streaming_chat_and_stop(server: EmbeddedServer) -> None:
    want, _ = _generate(server, QUESTION, max_tokens=12, temperature=0)
    stop = want.split()[2]  # a word the greedy answer contains

    async def run() -> tuple[str, str | None]:
        async with openai.AsyncOpenAI(base_url=base_url(server), api_key=KEY) as c:
            stream = await c.chat.completions.create(
                model=GENERATOR,
                messages=[{"role": "user", "content": QUESTION}],
                max_tokens=12,
                stop=[stop],
                stream=True,
            )
            parts, reason = [], None
            async for chunk in stream:
                if chunk.choices:
                    parts.append(chunk.choices[0].delta.content or "")
                    reason = chunk.choices[0].finish_reason or reason
        return "".join(parts), reason

    text, reason = asyncio.run(run())
    assert text == want[: want.index(stop)] and reason == "stop"


def test_completions_take_the_prompt_without_template(server: EmbeddedServer, client: Any) -> None:
    prompt = "The capital of France is"
    want, reason = _generate(server, prompt, max_tokens=6, temperature=0, chat_template=False)
    got = client.completions.create(model=GENERATOR, prompt=prompt, max_tokens=6, temperature=0)
    assert got.choices[0].text == want and got.choices[0].finish_reason == reason
    streamed = client.completions.create(model=GENERATOR, prompt=prompt, max_tokens=6, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == want


def test_seeded_sampling_is_reproducible(client: Any) -> None:
    def once() -> str:
        out = client.chat.completions.create(
            model=GENERATOR,
            messages=[{"role": "user", "content": "Tell me a word."}],
            max_tokens=8,
            temperature=1.0,
            top_p=0.9,
            seed=1234,
        )
        return str(out.choices[0].message.content)

    assert once() == once()


@pytest.mark.parametrize(
    ("call", "error", "param"),
    [
        (
            lambda c: c.chat.completions.create(
                model=GENERATOR, messages=[{"role": "user", "content": "x"}], n=9
            ),
            "BadRequestError",
            "n",
        ),
        (lambda c: c.embeddings.create(model="nope", input="x"), "NotFoundError", "model"),
        (
            lambda c: c.embeddings.create(model=EMBEDDING_IDS[0], input="x", dimensions=3),
            "BadRequestError",
            "dimensions",
        ),
        (
            lambda c: c.chat.completions.create(
                model=GENERATOR, messages=[{"role": "user", "content": "x"}], max_tokens=10**6
            ),
            "BadRequestError",
            "max_tokens",
        ),
        (
            lambda c: c.chat.completions.create(
                model=GENERATOR, messages=[{"role": "user", "content": "word " * 20000}]
            ),
            "BadRequestError",
            "messages",
        ),
    ],
)
def test_errors_have_openais_shape(client: Any, call: Any, error: str, param: str) -> None:
    with pytest.raises(getattr(openai, error)) as info:
        call(client)
    body = info.value.body
    assert body["param"] == param and body["type"] == "invalid_request_error"
    assert set(body) >= {"message", "type", "param", "code"}


def test_the_api_key_is_required_when_set(serve: ServeFn, tmp_path: Path) -> None:
    key = "s3cret-openai-key"
    server = serve(tmp_path, openai_api_key=key)  # an empty repository: /v1 lists nothing
    url = f"http://{server.http_url}/v1"
    assert openai.OpenAI(base_url=url, api_key=key).models.list().data == []
    c = openai.OpenAI(base_url=url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        c.models.list()
    assert info.value.status_code == 401 and info.value.body["code"] == "invalid_api_key"
    no_header = requests.get(f"{url}/models", timeout=30)
    assert no_header.status_code == 401
    assert no_header.json()["error"]["type"] == "authentication_error"
    assert requests.get(f"http://{server.http_url}/v2/health/live", timeout=30).ok  # v2 is not


def test_body_limits_apply_to_v1(server: EmbeddedServer) -> None:
    limits = server.settings.front_limits
    url, auth = f"{base_url(server)}/embeddings", AUTH
    big = requests.post(url, data=b"x" * (limits.max_body_bytes + 1), headers=auth, timeout=60)
    assert big.status_code == 413 and "max_body_bytes" in big.json()["error"]["message"]
    deep = (
        b'{"input": '
        + b"[" * (limits.max_json_depth + 1)
        + b"]" * (limits.max_json_depth + 1)
        + b"}"
    )
    nested = requests.post(url, data=deep, headers=auth, timeout=60)
    assert nested.status_code == 400 and "max_json_depth" in nested.json()["error"]["message"]
    garbage = requests.post(url, data=b"{not json", headers=auth, timeout=60)
    assert garbage.status_code == 400 and garbage.json()["error"]["type"] == "invalid_request_error"
    unknown = requests.get(f"{base_url(server)}/files", headers=auth, timeout=60)
    assert unknown.status_code == 404


def test_v1_requests_count_in_tritons_metrics(server: EmbeddedServer, client: Any) -> None:
    model = CATALOG[EMBEDDING_IDS[0]].triton_model
    before = _gauge(server, "nv_inference_request_success", model)
    client.embeddings.create(model=EMBEDDING_IDS[0], input="count me")
    assert _gauge(server, "nv_inference_request_success", model) == before + 1


def test_a_client_that_goes_away_frees_the_slot(server: EmbeddedServer) -> None:
    response = requests.post(
        f"{base_url(server)}/chat/completions",
        json={
            "model": GENERATOR,
            "messages": [{"role": "user", "content": "Write a long story about a dragon."}],
            "max_tokens": CATALOG[GENERATOR].param_int("max_new_tokens_limit"),
            "stream": True,
        },
        headers=AUTH,
        stream=True,
        timeout=120,
    )
    lines = response.iter_lines()
    data = [line for line in (next(lines) for _ in range(6)) if line.startswith(b"data:")]
    assert data and "choices" in json.loads(data[0][5:])
    seen = time.monotonic() + 30
    while _gauge(server, "tritonforge_generate_running_sequences", GENERATOR) < 1:
        assert time.monotonic() < seen, "the streaming sequence is not counted as running"
        time.sleep(0.05)
    response.close()  # the client goes away mid-stream
    deadline = time.monotonic() + 30
    while _gauge(server, "tritonforge_generate_running_sequences", GENERATOR) > 0:
        assert time.monotonic() < deadline, "the abandoned /v1 stream still holds its slot"
        time.sleep(0.1)


def test_langchain_embeddings_and_chat(server: EmbeddedServer) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    embedder = langchain_openai.OpenAIEmbeddings(
        model=EMBEDDING_IDS[0],
        base_url=base_url(server),
        api_key=KEY,
        check_embedding_ctx_length=False,  # else it tokenizes with tiktoken (OpenAI's vocab)
    )
    got = np.array(embedder.embed_documents(TEXTS), np.float32)
    want = v2_embeddings(server)
    assert np.abs(got - want).max() <= 1e-6
    chat = langchain_openai.ChatOpenAI(
        model=GENERATOR, base_url=base_url(server), api_key=KEY, temperature=0, max_tokens=8
    )
    want_text, _ = _generate(server, QUESTION, max_tokens=8, temperature=0)
    assert chat.invoke(QUESTION).content == want_text
    assert "".join(str(c.content) for c in chat.stream(QUESTION)) == want_text
