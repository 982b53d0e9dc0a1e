"""Cohere/Jina rerank request parsing and response rendering (tritonforge.tasks.rerank.protocol)."""

from __future__ import annotations

from typing import Any

import pytest

from tritonforge.errors import InvalidInputError
from tritonforge.tasks.rerank.protocol import (
    COHERE,
    JINA,
    Ranked,
    RerankLimits,
    RerankRequestError,
    parse_request,
    render_response,
)

LIMITS = RerankLimits(max_documents=3, max_document_bytes=20, max_query_bytes=30)


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "rerank", "query": "what is triton?", "documents": ["a", "b"], **fields}


def test_strings_and_text_objects_parse_alike() -> None:
    plain = parse_request(body(), LIMITS)
    objects = parse_request(body(documents=[{"text": "a"}, {"text": "b"}]), LIMITS)
    assert plain == objects
    assert plain.documents == ("a", "b") and plain.top_n is None and plain.model == "rerank"


def test_return_documents_default_differs_per_api() -> None:
    assert parse_request(body(), LIMITS, COHERE).return_documents is False
    assert parse_request(body(), LIMITS, JINA).return_documents is True
    assert parse_request(body(return_documents=True), LIMITS, COHERE).return_documents is True


def test_tabs_newlines_and_non_ascii_are_text() -> None:
    request = parse_request(body(documents=["line\none\tcol\r", "Ünïcödé 🚀"]), LIMITS)
    assert request.documents == ("line\none\tcol\r", "Ünïcödé 🚀")


def test_top_n_larger_than_documents_means_all() -> None:
    assert parse_request(body(top_n=10), LIMITS).top_n == 2
    assert parse_request(body(top_n=1), LIMITS).top_n == 1


def test_model_may_be_left_out() -> None:
    request = {"query": "q", "documents": ["d"]}
    assert parse_request(request, LIMITS).model is None


@pytest.mark.parametrize(
    ("request_body", "field"),
    [
        (["not", "an", "object"], "body"),
        (body(documents=[]), "documents"),
        ({"query": "q"}, "documents"),
        (body(documents="a"), "documents"),
        (body(documents=["a", "b", "c", "d"]), "documents"),
        (body(documents=["a", 3]), "documents[1]"),
        (body(documents=["a", None]), "documents[1]"),
        (body(documents=["a", {"txt": "b"}]), "documents[1]"),
        (body(documents=[{"text": 5}]), "documents[0].text"),
        (body(documents=["a", "x" * 21]), "documents[1]"),
        (body(documents=["a", "   "]), "documents[1]"),
        (body(documents=["é" * 11]), "documents[0]"),  # 22 UTF-8 bytes
        (body(documents=["a", "bell\x07"]), "documents[1]"),
        (body(documents=["a\ud800b"]), "documents[0]"),
        (body(query=None), "query"),
        (body(query=["q"]), "query"),
        (body(query=""), "query"),
        (body(query="q" * 31), "query"),
        (body(top_n=0), "top_n"),
        (body(top_n=-1), "top_n"),
        (body(top_n="2"), "top_n"),
        (body(top_n=1.5), "top_n"),
        (body(top_n=True), "top_n"),
        (body(return_documents="yes"), "return_documents"),
        (body(model=7), "model"),
        (body(rank_fields=["title"]), "rank_fields"),
        (body(max_tokens_per_doc=100), "max_tokens_per_doc"),
        (body(temperature=0), "temperature"),
    ],
)
def test_bad_input_names_the_field(request_body: Any, field: str) -> None:
    with pytest.raises(RerankRequestError) as caught:
        parse_request(request_body, LIMITS)
    assert caught.value.field == field
    assert repr(field) in str(caught.value)
    assert caught.value.status == 400
    assert isinstance(caught.value, InvalidInputError)  # INVALID_ARG through Triton


def test_unsupported_fields_pass_when_null() -> None:
    assert parse_request(body(rank_fields=None, max_chunks_per_doc=None), LIMITS).top_n is None


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_documents"):
        RerankLimits(max_documents=0)


RANKED = [Ranked(1, 0.9, 2.2), Ranked(0, 0.1, -2.2)]


def test_cohere_response_shape() -> None:
    request = parse_request(body(return_documents=True), LIMITS, COHERE)
    out = render_response(request, RANKED, "rerank", input_tokens=17, response_id="abc")
    assert out == {
        "id": "abc",
        "results": [
            {"index": 1, "relevance_score": 0.9, "document": {"text": "b"}},
            {"index": 0, "relevance_score": 0.1, "document": {"text": "a"}},
        ],
        "meta": {
            "api_version": {"version": "2"},
            "billed_units": {"search_units": 1},
            "tokens": {"input_tokens": 17, "output_tokens": 0},
        },
    }


def test_jina_response_shape_without_documents() -> None:
    request = parse_request(body(return_documents=False), LIMITS, JINA)
    out = render_response(request, RANKED[:1], "rerank", input_tokens=5, response_id="abc")
    assert out == {
        "model": "rerank",
        "usage": {"total_tokens": 5, "prompt_tokens": 5},
        "results": [{"index": 1, "relevance_score": 0.9}],
    }


def test_unknown_api_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="api"):
        parse_request(body(), LIMITS, "openai")
