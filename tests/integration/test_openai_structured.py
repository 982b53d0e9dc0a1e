"""Structured output through ``/v1`` on the real embedded Triton, with the ``openai`` client
(issue #34's done-means): 20 JSON schemas of our own give outputs that parse and validate
(``jsonschema``) 20/20 on the int8 default and on fp32; unconstrained greedy output is
token-identical with and without logprobs asked; logprobs equal log_softmax of the fp32
decoder's logits within 1e-4; ``n=4`` with a ``seed`` is reproducible; bad values are 400s
naming the field; the same parameters reach the generate model over v2 (request parameters)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import numpy as np
import pytest

from tests.conftest import PIPELINE_REPOSITORY
from tritonforge.pipelines import generator_from_repository, repository_configs
from tritonforge.runtime.front.openai.catalog import EMBEDDING, catalog
from tritonforge.runtime.serving import EmbeddedServer

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.integration
KEY = "not-checked"
CATALOG = catalog(repository_configs(PIPELINE_REPOSITORY))
MAX_TOKENS = 96  # the longest instance below is ~60 tokens; a grammar row ends at its end
# concurrent requests: under the model's max_running (16), so none waits for a slot (the
# queue forecast refuses a request whose slot is further than queue_timeout_s)
CONCURRENCY = 10

_S = {"type": "string", "minLength": 1, "maxLength": 12}
_INT = {"type": "integer", "minimum": 0, "maximum": 1000}


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
        "additionalProperties": False,
    }


# (prompt, schema): nested objects, arrays, enums, required fields, bounded numbers
CASES: list[tuple[str, dict[str, Any]]] = [
    ("A person with a name and an age, as JSON.", _obj({"name": _S, "age": _INT})),
    ("A book: title, author and year.", _obj({"title": _S, "author": _S, "year": _INT})),
    (
        "A user record: user (name, email) and whether active.",
        _obj({"user": _obj({"name": _S, "email": _S}), "active": {"type": "boolean"}}),
    ),
    (
        "Two items of an order with sku and quantity.",
        _obj(
            {
                "items": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 2,
                    "items": _obj(
                        {
                            "sku": {"type": "string", "maxLength": 6},
                            "qty": {"type": "integer", "minimum": 1, "maximum": 9},
                        }
                    ),
                }
            }
        ),
    ),
    (
        "A t-shirt color and size.",
        _obj({"color": {"enum": ["red", "green", "blue"]}, "size": {"enum": ["S", "M", "L"]}}),
    ),
    (
        "The weather in Paris.",
        _obj(
            {
                "celsius": {"type": "integer", "minimum": -50, "maximum": 60},
                "humidity": {"type": "integer", "minimum": 0, "maximum": 100},
            }
        ),
    ),
    (
        "A blog post title and tags.",
        _obj({"title": _S, "tags": {"type": "array", "items": _S, "maxItems": 3}}),
    ),
    ("The capital of France.", {"type": "object"}),  # json_object
    (
        "A city and its country.",
        _obj({"city": _S, "country": _S, "population": _INT}, ["city", "country"]),
    ),
    ("Is the sky blue? Answer yes or no.", _obj({"answer": {"enum": ["yes", "no"]}})),
    (
        "Rate a movie from 1 to 5 with a short comment.",
        _obj({"stars": {"type": "integer", "minimum": 1, "maximum": 5}, "comment": _S}),
    ),
    (
        "A point in 2D.",
        _obj(
            {
                "x": {"type": "number", "minimum": -10, "maximum": 10},
                "y": {"type": "number", "minimum": -10, "maximum": 10},
            }
        ),
    ),
    (
        "Three primary colors.",
        _obj({"colors": {"type": "array", "items": _S, "minItems": 3, "maxItems": 3}}),
    ),
    (
        "A company with its address (street, city).",
        _obj({"company": _S, "address": _obj({"street": _S, "city": _S})}),
    ),
    (
        "A task with a priority (low, medium, high) and done flag.",
        _obj(
            {
                "task": _S,
                "priority": {"enum": ["low", "medium", "high"]},
                "done": {"type": "boolean"},
            }
        ),
    ),
    (
        "A list of two numbers between 0 and 9.",
        _obj(
            {
                "numbers": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 0, "maximum": 9},
                    "minItems": 2,
                    "maxItems": 2,
                }
            }
        ),
    ),
    (
        "A pet: its kind and name.",
        _obj({"kind": {"type": "string", "enum": ["cat", "dog", "fish"]}, "name": _S}),
    ),
    (
        "A meeting: topic and attendees with names.",
        _obj(
            {
                "topic": _S,
                "attendees": {"type": "array", "items": _obj({"name": _S}), "maxItems": 2},
            }
        ),
    ),
    (
        "A product with a price between 0 and 100.",
        _obj({"product": _S, "price": {"type": "number", "minimum": 0, "maximum": 100}}),
    ),
    (
        "A greeting in a language.",
        _obj({"language": {"enum": ["en", "fr", "de"]}, "text": _S, "formal": {"type": "boolean"}}),
    ),
]


def _model(variant: str) -> str:
    try:
        group = generator_from_repository(PIPELINE_REPOSITORY)
    except LookupError:
        pytest.skip(reason=f"no generation models in {PIPELINE_REPOSITORY} (run `make export`)")
    if variant not in group.variants:
        pytest.skip(reason=f"the {variant} decoder is not exported")
    return group.model(variant)


@pytest.fixture(scope="module")
def client(pipeline_server: EmbeddedServer) -> Any:
    url = f"http://{pipeline_server.http_url}/v1"
    return openai.OpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=300)


def _format(schema: dict[str, Any]) -> dict[str, Any]:
    if schema == {"type": "object"}:
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}


@pytest.mark.parametrize("variant", ["int8", "fp32"])
def test_twenty_schemas_give_valid_json(client: Any, variant: str) -> None:
    model = _model(variant)

    def ask(case: tuple[str, dict[str, Any]]) -> tuple[str, str]:
        prompt, schema = case
        out = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            response_format=_format(schema),
            max_tokens=MAX_TOKENS,
            temperature=0,
        )
        return out.choices[0].message.content, out.choices[0].finish_reason

    with ThreadPoolExecutor(CONCURRENCY) as pool:  # rows batched in the scheduler
        answers = list(pool.map(ask, CASES))
    bad = []
    for (prompt, schema), (text, finish) in zip(CASES, answers, strict=True):
        try:
            assert finish == "stop", f"finish_reason {finish}"
            jsonschema.validate(json.loads(text), schema)
        except (AssertionError, ValueError, jsonschema.ValidationError) as e:
            bad.append(f"{prompt!r}: {text!r} ({str(e)[:80]})")
    assert not bad, f"{len(bad)}/{len(CASES)} invalid:\n" + "\n".join(bad)


def test_unconstrained_greedy_is_token_identical_with_logprobs(client: Any) -> None:
    model = _model("int8")
    kw = {"model": model, "prompt": "The three primary colors are", "max_tokens": 24}
    plain = client.completions.create(**kw, temperature=0)
    hooked = client.completions.create(**kw, temperature=0, logprobs=2)
    assert plain.choices[0].text == hooked.choices[0].text
    lp = hooked.choices[0].logprobs
    assert "".join(lp.tokens) == hooked.choices[0].text
    assert len(lp.tokens) == hooked.usage.completion_tokens
    assert all(len(t) == 2 for t in lp.top_logprobs)


def test_logprobs_equal_log_softmax_of_the_fp32_decoder(client: Any) -> None:
    from tokenizers import Tokenizer

    from tritonforge.decoder import OrtDecoder
    from tritonforge.generation import with_bos

    model = _model("fp32")
    prompt = "Water boils at"
    out = client.completions.create(
        model=model, prompt=prompt, max_tokens=4, temperature=0, logprobs=5
    )
    lp = out.choices[0].logprobs
    version = PIPELINE_REPOSITORY / model / "1"
    meta = json.loads((version / "generation.json").read_text())
    tok = Tokenizer.from_file(str(version / "tokenizer.json"))
    ids = with_bos(
        tok.encode(prompt, add_special_tokens=False).ids, meta.get("prompt_bos_token_id")
    )
    decoder = OrtDecoder(version / "decoder.onnx", 1, {})
    for k, logprob in enumerate(lp.token_logprobs):
        x = np.asarray([ids], np.int64)
        logits, _ = decoder(x, np.ones_like(x), np.arange(x.shape[1])[None], decoder.empty_past(1))
        row = logits[0, -1].astype(np.float64)
        reference = row - (row.max() + np.log(np.exp(row - row.max()).sum()))
        chosen = int(np.argmax(row))
        assert abs(logprob - reference[chosen]) < 1e-4, k
        top = np.argsort(-reference, kind="stable")[:5]
        assert sorted(lp.top_logprobs[k].values(), reverse=True) == pytest.approx(
            reference[top].tolist(), abs=1e-4
        )
        ids = [*ids, chosen]


def test_chat_logprobs_have_openais_shape_streamed_too(client: Any) -> None:
    model = _model("int8")
    kw: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "What is 2+2?"}],
        "max_tokens": 12,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 3,
    }
    whole = client.chat.completions.create(**kw)
    content = whole.choices[0].logprobs.content
    assert "".join(c.token for c in content) == whole.choices[0].message.content
    assert all(len(c.top_logprobs) == 3 and c.logprob <= 0 for c in content)
    assert content[0].top_logprobs[0].logprob >= content[0].top_logprobs[1].logprob
    streamed = [
        c
        for chunk in client.chat.completions.create(**kw, stream=True)
        for choice in chunk.choices
        if choice.logprobs is not None
        for c in choice.logprobs.content
    ]
    assert [c.token for c in streamed] == [c.token for c in content]
    assert [c.logprob for c in streamed] == pytest.approx([c.logprob for c in content])


def test_n_choices_with_a_seed_are_reproducible(client: Any) -> None:
    model = _model("int8")

    def ask() -> list[str]:
        out = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Name an animal."}],
            max_tokens=10,
            temperature=1.0,
            seed=7,
            n=4,
        )
        assert [c.index for c in out.choices] == [0, 1, 2, 3]
        return [str(c.message.content) for c in out.choices]

    first = ask()
    assert ask() == first
    assert len(set(first)) > 1  # seed + i per choice: the rows differ


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nope"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        ({"logit_bias": {"999999": 1}}, "logit_bias.999999"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"n": 9}, "n"),
    ],
)
def test_bad_values_are_400s_naming_the_field(
    client: Any, extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=_model("int8"), messages=[{"role": "user", "content": "x"}], **extra
        )
    assert info.value.body["param"] == param


def test_v2_request_parameters_reach_the_generate_model(pipeline_server: EmbeddedServer) -> None:
    from tritonforge.client.generate import GenerateClient

    schema = CASES[0][1]
    c = GenerateClient(
        pipeline_server.grpc_url, protocol="grpc", model=_model("int8"), timeout_s=300
    )
    fmt = json.dumps(_format(schema))
    text = "".join(
        ch.text for ch in c.stream(CASES[0][0], response_format=fmt, max_tokens=MAX_TOKENS)
    )
    jsonschema.validate(json.loads(text), schema)
    with pytest.raises(Exception, match="presence_penalty"):
        list(c.stream("x", presence_penalty=9.0))


def test_tokenize_and_detokenize_in_vllms_shape(pipeline_server: EmbeddedServer) -> None:
    import requests
    from tokenizers import Tokenizer

    from tritonforge.generation import with_bos
    from tritonforge.modelconfig import ModelConfig

    url = f"http://{pipeline_server.http_url}"
    model = _model("int8")
    prompt = "Hello there, how are you?"
    r = requests.post(f"{url}/tokenize", json={"model": model, "prompt": prompt}, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    config = ModelConfig.from_pbtxt((PIPELINE_REPOSITORY / model / "config.pbtxt").read_text())
    assert out["max_model_len"] == config.param("max_prompt_tokens", kind=int)
    version = PIPELINE_REPOSITORY / model / "1"
    tok = Tokenizer.from_file(str(version / "tokenizer.json"))
    bos = json.loads((version / "generation.json").read_text()).get("prompt_bos_token_id")
    # the ids the generate model decodes from (GenerateEngine.prompt_ids)
    assert out["tokens"] == with_bos(tok.encode(prompt, add_special_tokens=False).ids, bos)
    assert out["count"] == len(out["tokens"])
    back = requests.post(
        f"{url}/detokenize", json={"model": model, "tokens": out["tokens"]}, timeout=60
    ).json()
    assert back["prompt"].endswith(prompt)
    chat = requests.post(
        f"{url}/tokenize",
        json={"model": model, "messages": [{"role": "user", "content": prompt}]},
        timeout=60,
    ).json()
    assert chat["count"] > out["count"]  # the chat template's own tokens
    embedder = next(m for m, s in CATALOG.items() if s.kind == EMBEDDING)
    enc = requests.post(f"{url}/tokenize", json={"model": embedder, "prompt": "hi"}, timeout=60)
    assert enc.status_code == 200 and enc.json()["count"] == 3  # [CLS] hi [SEP]
    bad = requests.post(f"{url}/detokenize", json={"model": model, "tokens": [-1]}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 20}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The current time in a timezone.",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"enum": ["UTC", "CET", "PST"]}},
            "required": ["timezone"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather like in Paris?"}]


def test_tool_calls_round_trip_with_the_openai_client(client: Any) -> None:
    model = _model("int8")
    out = client.chat.completions.create(
        model=model,
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=48,
        temperature=0,
    )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name in ("get_weather", "get_time")
    spec = next(t for t in (WEATHER, TIME) if t["function"]["name"] == call.function.name)
    jsonschema.validate(json.loads(call.function.arguments), spec["function"]["parameters"])
    named = client.chat.completions.create(
        model=model,
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=48,
        temperature=0,
    )
    assert named.choices[0].message.tool_calls[0].function.name == "get_time"
    answer = client.chat.completions.create(  # the result comes back as a tool message
        model=model,
        messages=[
            *ASK,
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": '{"celsius": 21}'},
        ],
        tools=[WEATHER, TIME],
        max_tokens=24,
        temperature=0,
    )
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    streamed = list(
        client.chat.completions.create(
            model=model,
            messages=ASK,
            tools=[WEATHER],
            tool_choice="required",
            max_tokens=48,
            temperature=0,
            stream=True,
        )
    )
    deltas = [d for c in streamed for ch in c.choices for d in (ch.delta.tool_calls or [])]
    assert deltas and deltas[0].function.name == "get_weather"
    assert json.loads(deltas[0].function.arguments)["city"]
    assert streamed[-1].choices[0].finish_reason == "tool_calls"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=model,
            messages=ASK,
            tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )
    assert info.value.body["param"] == "tool_choice"


def test_langchain_bind_tools_gets_the_call(pipeline_server: EmbeddedServer) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return "sunny"

    llm = langchain_openai.ChatOpenAI(
        model=_model("int8"),
        base_url=f"http://{pipeline_server.http_url}/v1",
        api_key=KEY,
        temperature=0,
        max_tokens=48,
        max_retries=0,
    )
    message = llm.bind_tools([get_weather], tool_choice="get_weather").invoke(ASK[0]["content"])
    assert message.tool_calls and message.tool_calls[0]["name"] == "get_weather"
    assert isinstance(message.tool_calls[0]["args"].get("city"), str)
