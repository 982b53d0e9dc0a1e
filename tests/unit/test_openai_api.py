"""The /v1 layer's pure parts: the catalog from configs, request parsing (OpenAI's error shape,
naming the field), response and stream-chunk shapes, the Triton request/response encoding."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from tritonforge.generation import (
    FINISH_REASON,
    TEXT_INPUT,
    TEXT_OUTPUT,
    render_chat,
    render_prompt,
)
from tritonforge.runtime.errors import OpenAIError
from tritonforge.runtime.front.openai.catalog import (
    EMBEDDING,
    GENERATION,
    ServedModel,
    catalog,
    is_generator,
    models_list,
    resolve,
)
from tritonforge.runtime.front.openai.requests import (
    bearer_token,
    check_prompt_tokens,
    parse_chat,
    parse_completion,
    parse_embeddings,
)
from tritonforge.runtime.front.openai.responses import (
    chat_chunk,
    chat_completion,
    embeddings_response,
    sse,
    upstream_error,
    usage,
)
from tritonforge.runtime.front.openai.upstream import (
    StreamChunk,
    bytes_tensor,
    embedding_outputs,
    generate_request,
    stream_chunk,
    unbytes,
)

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _param(value: str) -> dict[str, str]:
    return {"string_value": value}


def _config(
    name: str, role: str, variant: str | None = None, task: str = "embedding"
) -> dict[str, Any]:
    params = {
        "tritonforge.pipeline": _param("embed" if task == "embedding" else "classify"),
        "tritonforge.role": _param(role),
        "tritonforge.task": _param(task),
        "max_items": _param("4"),
        "max_text_bytes": _param("32"),
    }
    if variant:
        params["tritonforge.variant"] = _param(variant)
    out = (
        [{"name": "embedding", "data_type": "TYPE_FP32", "dims": [384]}]
        if task == "embedding"
        else [{"name": "probabilities", "data_type": "TYPE_FP32", "dims": [3]}]
    )
    return {
        "name": name,
        "max_batch_size": 4,
        "input": [{"name": "text", "data_type": "TYPE_STRING", "dims": [1]}],
        "output": out,
        "parameters": params,
    }


GENERATE = {
    "name": "generate",
    "model_transaction_policy": {"decoupled": True},
    "input": [{"name": TEXT_INPUT, "data_type": "TYPE_STRING", "dims": [1]}],
    "output": [
        {"name": TEXT_OUTPUT, "data_type": "TYPE_STRING", "dims": [1]},
        {"name": FINISH_REASON, "data_type": "TYPE_STRING", "dims": [1]},
    ],
    "parameters": {
        "max_new_tokens_limit": _param("64"),
        "max_prompt_tokens": _param("100"),
        "tokenizer_file": _param("tokenizer.json"),
    },
}
CONFIGS = [
    _config("embed", "ensemble", "fp32"),
    _config("embed_int8", "ensemble", "int8"),
    _config("embed_bls", "bls"),
    _config("tokenizer", "tokenizer"),
    _config("classify", "ensemble", "fp32", task="classification"),
    GENERATE,
]


@pytest.fixture
def models() -> dict[str, ServedModel]:
    return catalog(CONFIGS)


def _refused(exc: pytest.ExceptionInfo[OpenAIError], status: int, param: str | None) -> str:
    assert exc.value.status == status
    assert exc.value.param == param
    body = exc.value.body()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    return str(body["message"])


def test_catalog_has_a_model_per_embedding_variant_and_the_generator(
    models: dict[str, ServedModel],
) -> None:
    assert sorted(models) == ["embed", "embed-int8", "generate"]  # no classifier
    assert models["embed-int8"].triton_model == "embed_int8"
    assert models["embed"].dim == 384 and models["embed"].tokenizer_model == "tokenizer"
    assert models["generate"].kind == GENERATION
    listed = models_list(models, 0)
    assert [m["id"] for m in listed["data"]] == sorted(models)
    assert all(m["object"] == "model" for m in listed["data"])


def test_a_non_decoupled_model_with_the_same_tensors_is_not_a_generator() -> None:
    assert is_generator(GENERATE)
    assert not is_generator({**GENERATE, "model_transaction_policy": {}})


def test_triton_name_resolves_and_unknown_or_wrong_kind_is_404(
    models: dict[str, ServedModel],
) -> None:
    assert resolve(models, {"model": "embed_int8"}, EMBEDDING).id == "embed-int8"
    with pytest.raises(OpenAIError) as e:
        resolve(models, {"model": "classify"}, EMBEDDING)
    assert "embed-int8" in _refused(e, 404, "model")
    assert e.value.code == "model_not_found"
    with pytest.raises(OpenAIError) as e:
        resolve(models, {"model": "generate"}, EMBEDDING)
    assert "a generation model, not embedding" in _refused(e, 404, "model")
    with pytest.raises(OpenAIError) as e:
        resolve(models, {}, EMBEDDING)
    _refused(e, 400, "model")


def test_embeddings_accept_a_string_or_a_list(models: dict[str, ServedModel]) -> None:
    one = parse_embeddings({"model": "embed", "input": "hi"}, models)
    assert one.texts == ["hi"] and one.encoding_format == "float"
    many = parse_embeddings(
        {"model": "embed", "input": ["a", "b"], "encoding_format": "base64", "dimensions": 384},
        models,
    )
    assert many.texts == ["a", "b"] and many.encoding_format == "base64"


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ({"input": []}, "input", "non-empty"),
        ({"input": [[1, 2, 3]]}, "input", "token arrays"),
        ({"input": [""]}, "input", "empty"),
        ({"input": ["x" * 33]}, "input", "at most 32"),
        ({"input": ["a"] * 5}, "input", "at most 4"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format", "float"),
        ({"input": "a", "dimensions": 128}, "dimensions", "384"),
        ({"input": "a", "dimensions": True}, "dimensions", "384"),
    ],
)
def test_bad_embedding_requests_name_the_field(
    models: dict[str, ServedModel], body: dict[str, Any], param: str, fragment: str
) -> None:
    with pytest.raises(OpenAIError) as e:
        parse_embeddings({"model": "embed", **body}, models)
    assert fragment in _refused(e, 400, param)


def test_base64_is_little_endian_float32_as_the_openai_client_decodes() -> None:
    vectors = np.array([[0.5, -1.25, 3.0]], np.float32)
    out = embeddings_response("embed", vectors, "base64", 7)
    raw = base64.b64decode(out["data"][0]["embedding"])
    assert np.frombuffer(raw, dtype="<f4").tolist() == [0.5, -1.25, 3.0]
    assert out["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    floats = embeddings_response("embed", vectors, "float", 7)
    assert floats["data"][0] == {"object": "embedding", "index": 0, "embedding": [0.5, -1.25, 3.0]}


def test_one_user_message_renders_like_the_generate_models_own_template() -> None:
    assert render_chat([{"role": "user", "content": "Hi"}], TEMPLATE) == render_prompt(
        "Hi", TEMPLATE, True
    )


def test_chat_maps_sampling_onto_the_generate_parameters(
    models: dict[str, ServedModel],
) -> None:
    req = parse_chat(
        {
            "model": "generate",
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            ],
            "max_completion_tokens": 8,
            "temperature": 0.5,
            "top_p": 0.9,
            "seed": 3,
            "cache_salt": "user-42",
            "stop": "\n",
            "n": 1,
            "stream": True,
            "stream_options": {"include_usage": True},
            "user": "ignored",
        },
        models,
        TEMPLATE,
    )
    assert req.prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi")
    assert req.prompt.endswith("<|im_start|>assistant\n")
    assert req.parameters == {
        "max_tokens": 8,
        "temperature": 0.5,
        "top_p": 0.9,
        "seed": 3,
        "cache_salt": "user-42",
        "chat_template": False,
    }
    assert req.stop == ["\n"] and req.stream and req.include_usage


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 9}, "n"),
        ({"n": 2, "stream": True}, "n"),
        ({"max_tokens": 65}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 4, "max_completion_tokens": 5}, "max_tokens"),
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"seed": -1}, "seed"),
        ({"cache_salt": 7}, "cache_salt"),
        ({"cache_salt": ""}, "cache_salt"),
        ({"cache_salt": "x" * 513}, "cache_salt"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": [""]}, "stop"),
        ({"logprobs": 3}, "logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias.5"),
        ({"tools": [{"type": "function"}]}, "tools[0].function"),
        ({"tools": [], "tool_choice": "required"}, "tool_choice"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": "a"}, "frequency_penalty"),
        ({"stream": "yes"}, "stream"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
    ],
)
def test_bad_chat_requests_name_the_field(
    models: dict[str, ServedModel], extra: dict[str, Any], param: str
) -> None:
    body = {"model": "generate", "messages": [{"role": "user", "content": "Hi"}], **extra}
    with pytest.raises(OpenAIError) as e:
        parse_chat(body, models, TEMPLATE)
    _refused(e, 400, param)


def test_an_empty_cache_salt_says_to_leave_it_out(models: dict[str, ServedModel]) -> None:
    """An empty salt is refused (vLLM's rule) with what to do instead; ``null`` is not set."""
    body = {"model": "generate", "messages": [{"role": "user", "content": "Hi"}]}
    with pytest.raises(OpenAIError, match="leave it out") as e:
        parse_chat({**body, "cache_salt": ""}, models, TEMPLATE)
    _refused(e, 400, "cache_salt")
    parse_chat({**body, "cache_salt": None}, models, TEMPLATE)


def test_structured_fields_and_n_become_request_parameters(
    models: dict[str, ServedModel],
) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    body = {
        "model": "generate",
        "messages": [{"role": "user", "content": "Hi"}],
        "response_format": fmt,
        "logit_bias": {"7": -100},
        "presence_penalty": 0.5,
        "logprobs": True,
        "top_logprobs": 2,
        "n": 3,
    }
    req = parse_chat(body, models, TEMPLATE, vocab_size=100)
    assert req.n == 3 and req.logprobs
    assert json.loads(req.parameters["response_format"]) == fmt
    assert json.loads(req.parameters["logit_bias"]) == {"7": -100}
    assert req.parameters["presence_penalty"] == 0.5 and req.parameters["top_logprobs"] == 2
    with pytest.raises(OpenAIError) as e:
        parse_chat({**body, "logit_bias": {"100": 1}}, models, TEMPLATE, vocab_size=100)
    _refused(e, 400, "logit_bias.100")
    plain = parse_completion({"model": "generate", "prompt": "a", "logprobs": 2}, models)
    assert plain.logprobs and plain.parameters["logprobs"] == 2
    for bad, param in (({"logprobs": True}, "logprobs"), ({"top_logprobs": 1}, "top_logprobs")):
        with pytest.raises(OpenAIError) as e:
            parse_completion({"model": "generate", "prompt": "a", **bad}, models)
        _refused(e, 400, param)


def test_completion_takes_the_prompt_as_is(models: dict[str, ServedModel]) -> None:
    req = parse_completion({"model": "generate", "prompt": ["Once upon"]}, models)
    assert req.prompt == "Once upon" and req.parameters == {"chat_template": False}
    with pytest.raises(OpenAIError) as e:
        parse_completion({"model": "generate", "prompt": ["a", "b"]}, models)
    _refused(e, 400, "prompt")


def test_a_prompt_past_max_prompt_tokens_is_context_length_exceeded(
    models: dict[str, ServedModel],
) -> None:
    check_prompt_tokens(100, models["generate"], "messages")
    with pytest.raises(OpenAIError) as e:
        check_prompt_tokens(101, models["generate"], "messages")
    _refused(e, 400, "messages")
    assert e.value.code == "context_length_exceeded"


def test_chunks_and_completions_have_openais_shape() -> None:
    chunk = chat_chunk("id", 1, "generate", {"content": "x"}, None, None, True)
    assert chunk["object"] == "chat.completion.chunk" and chunk["usage"] is None
    assert chunk["choices"][0]["delta"] == {"content": "x"}
    final = chat_chunk("id", 1, "generate", None, None, usage(3, 2), True)
    assert final["choices"] == [] and final["usage"]["total_tokens"] == 5
    assert "usage" not in chat_chunk("id", 1, "generate", {}, "stop")
    whole = chat_completion("id", 1, "generate", "Hello", "length", usage(3, 2))
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": "Hello"}
    assert sse({"a": 1}) == b'data: {"a":1}\n\n'


@pytest.mark.parametrize(
    ("message", "status"),
    [
        ("generate: overloaded (16 running, 64 queued, max_queue 64); retry later", 503),
        (
            "generate: overloaded: queued longer than queue_timeout_s 10 s (16 running, 3 "
            "queued); retry later",
            503,
        ),
        ("generate is unavailable: its stub crashed and is reloading; retry: stream ended", 503),
        ("invalid sampling parameters: top_k must be >= 0", 400),
        ("generate: decoder step failed (RuntimeError: x)", 500),
    ],
)
def test_in_stream_errors_get_the_v2_status(message: str, status: int) -> None:
    assert upstream_error(message, "generate").status == status


def test_generate_request_and_stream_response_round_trip() -> None:
    request = generate_request("generate", "héllo", {"max_tokens": 4, "top_p": 0.5}, ["\n"], "r1")
    assert [t.name for t in request.inputs] == [TEXT_INPUT, "stop"]
    assert unbytes(request.raw_input_contents[0]) == ["héllo"]
    assert request.parameters["max_tokens"].int64_param == 4
    assert request.parameters["top_p"].double_param == 0.5
    assert request.parameters["triton_enable_empty_final_response"].bool_param
    response = service_pb2.ModelStreamInferResponse()
    for name, value in ((TEXT_OUTPUT, "wörld"), (FINISH_REASON, "length")):
        out = response.infer_response.outputs.add()
        out.name, out.datatype = name, "BYTES"
        response.infer_response.raw_output_contents.append(bytes_tensor([value]))
    assert stream_chunk(response, "generate") == StreamChunk("wörld", "length")
    failed = service_pb2.ModelStreamInferResponse(error_message="generate: overloaded")
    with pytest.raises(OpenAIError) as e:
        stream_chunk(failed, "generate")
    assert e.value.status == 503


def test_embedding_outputs_read_the_binary_part() -> None:
    values = np.arange(6, dtype="<f4")
    header = json.dumps(
        {
            "outputs": [
                {
                    "name": "embedding",
                    "shape": [2, 3],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 24},
                }
            ]
        }
    ).encode()
    out = embedding_outputs(header + values.tobytes(), str(len(header)), "embedding")
    assert out.tolist() == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(OpenAIError):
        embedding_outputs(header + values.tobytes(), str(len(header)), "missing")


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer  abc ", "abc"),
        ("Basic abc", None),
        ("Bearer ", None),
        (None, None),
    ],
)
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


def test_the_bls_versions_and_split_are_discovered() -> None:
    from tritonforge.pipelines import discover

    bls = _config("classify_bls", "bls", task="classification")
    bls["parameters"]["versions"] = _param("1,2")
    bls["parameters"]["version_weights"] = _param("1=80,2=20")
    found = discover([_config("classify", "ensemble", "fp32", task="classification"), bls])
    assert found["classify"].versions == (1, 2)
    assert found["classify"].version_weights == {1: 80, 2: 20}
    assert found["classify"].latest_version == 2
    assert discover(CONFIGS)["embed"].latest_version is None


def test_the_demos_split_line_counts_each_version() -> None:
    from tritonforge.tasks.classification.client import format_split

    line = format_split(["1", "2", "1", "1"], {1: 80, 2: 20})
    assert line == "v1 3/4 (configured 80%), v2 1/4 (configured 20%)"


def test_bench_adds_v1_cells_for_embedding_ensembles_only() -> None:
    import argparse

    from tritonforge.loadtest.bench.cells import OPENAI, targets_from
    from tritonforge.pipelines import discover

    args = argparse.Namespace(
        locust_protocols=["http", OPENAI],
        pa_protocols=["grpc", OPENAI],
        pipelines=["ensemble", "bls"],
        variants=["fp32", "int8"],
    )
    bls = _config("embed_bls", "bls")
    bls["parameters"]["encoder_models"] = _param("fp32=encoder_fp32,int8=encoder_int8")
    embed = discover(
        [_config("embed", "ensemble", "fp32"), _config("embed_int8", "ensemble", "int8"), bls]
    )
    v1 = [t for t in targets_from(args, embed["embed"]) if t.protocol == OPENAI]
    assert [(t.generator, t.pipeline, t.variant) for t in v1] == [
        ("locust", "ensemble", "fp32"),
        ("locust", "ensemble", "int8"),
    ]
    assert v1[0].label == "/v1/embeddings fp32 http/locust"
    classify = discover([_config("classify", "ensemble", "fp32", task="classification")])
    assert not [t for t in targets_from(args, classify["classify"]) if t.protocol == OPENAI]


def test_the_client_asks_a_versioned_bls_for_model_version() -> None:
    from tritonforge.pipelines import discover
    from tritonforge.tasks.classification.client import output_names

    bls = _config("classify_bls", "bls", task="classification")
    bls["parameters"]["versions"] = _param("1,2")
    found = discover([_config("classify", "ensemble", "fp32", task="classification"), bls])
    pipeline = found["classify"]
    assert output_names(pipeline, "classify_bls") == ["probabilities", "model_version"]
    assert output_names(pipeline, "classify") == ["probabilities"]  # the ensemble has none


def test_tokenize_takes_any_catalog_model_with_a_served_tokenizer() -> None:
    """/tokenize and /detokenize: a generator, or any model whose pipeline has a tokenizer
    stage (an embedder, a reranker), never one without a tokenizer to read."""
    from tritonforge.tasks.generation.routes import _text_model

    models = {
        "embed": ServedModel("embed", EMBEDDING, "embed", "embed", tokenizer_model="tok"),
        "rerank": ServedModel("rerank", "rerank", "rerank", "rerank", tokenizer_model="r_tok"),
        "other": ServedModel("other", "rerank", "other", "other"),
    }
    assert _text_model(models, {"model": "rerank"}).tokenizer_model == "r_tok"
    assert _text_model(models, {"model": "embed"}).id == "embed"
    with pytest.raises(OpenAIError, match="'model' must name a served text model") as e:
        _text_model(models, {"model": "other"})
    assert e.value.param == "model"
