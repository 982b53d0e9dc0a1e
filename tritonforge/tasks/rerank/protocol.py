"""The rerank HTTP shapes: Cohere's ``/v1/rerank`` and Jina's ``/rerank``, parsed and rendered.

Pure functions over JSON-decoded bodies (core: no web framework). Both APIs take the same request
(``model``, ``query``, ``documents`` as strings or ``{"text": ...}``, ``top_n``,
``return_documents``); they differ in the default of ``return_documents`` (Cohere: false, Jina:
true) and in the response's envelope (Cohere: ``id`` + ``meta``; Jina: ``model`` + ``usage``).
Every refusal is one :class:`RerankRequestError` naming the field (the front answers 400).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tritonforge.errors import InvalidInputError, shown

COHERE, JINA = "cohere", "jina"
APIS = (COHERE, JINA)
RETURN_DOCUMENTS_DEFAULT = {COHERE: False, JINA: True}
# Fields of the two APIs this server cannot honour: refused unless absent or null.
UNSUPPORTED_FIELDS = ("rank_fields", "max_chunks_per_doc", "max_tokens_per_doc")
KNOWN_FIELDS = ("model", "query", "documents", "top_n", "return_documents", *UNSUPPORTED_FIELDS)


class RerankRequestError(InvalidInputError):
    """A rerank request is malformed; ``field`` names the offending field (HTTP 400)."""

    status = 400

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.detail = message
        super().__init__(f"{field!r}: {message}")


@dataclass(frozen=True)
class RerankLimits:
    """Bounds on one request (from the task's spec): documents per request, UTF-8 bytes per
    document and of the query."""

    max_documents: int = 256
    max_document_bytes: int = 16384
    max_query_bytes: int = 4096

    def __post_init__(self) -> None:
        for name in ("max_documents", "max_document_bytes", "max_query_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"RerankLimits.{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class RerankRequest:
    """A validated request: ``top_n`` is None (every document) or 1..len(documents)."""

    query: str
    documents: tuple[str, ...]
    top_n: int | None
    return_documents: bool
    model: str | None = None
    api: str = COHERE


@dataclass(frozen=True)
class Ranked:
    """One result: the document's index in the request, its sigmoid score and raw logit."""

    index: int
    relevance_score: float
    logit: float


def check_text(value: Any, field: str, limit_bytes: int) -> str:
    """``value`` if it is a non-blank string of at most ``limit_bytes`` UTF-8 bytes without
    control characters (tab, newline and CR allowed) or lone surrogates; else
    :class:`RerankRequestError` naming ``field``."""
    if not isinstance(value, str):
        raise RerankRequestError(field, f"must be a string, got {type(value).__name__}")
    if not value.strip():
        raise RerankRequestError(field, "is empty or whitespace-only; send non-blank text")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as e:  # a lone surrogate (JSON "\ud800")
        raise RerankRequestError(
            field, f"has a lone surrogate at offset {e.start}; send valid Unicode text"
        ) from e
    if size > limit_bytes:
        raise RerankRequestError(
            field, f"is {size} UTF-8 bytes; at most {limit_bytes} are allowed (shorten it)"
        )
    for offset, char in enumerate(value):
        if unicodedata.category(char) == "Cc" and char not in "\t\n\r":
            raise RerankRequestError(
                field, f"has control character U+{ord(char):04X} at offset {offset}; send text"
            )
    return value


def check_document(item: Any, index: int, limits: RerankLimits) -> str:
    field = f"documents[{index}]"
    if isinstance(item, Mapping):
        extra = sorted(set(item) - {"text"})
        if "text" not in item or extra:
            raise RerankRequestError(
                field, f'an object must be {{"text": ...}} only (got keys {sorted(item)})'
            )
        return check_text(item["text"], f"{field}.text", limits.max_document_bytes)
    if not isinstance(item, str):
        raise RerankRequestError(
            field, f'must be a string or {{"text": ...}}, got {type(item).__name__}'
        )
    return check_text(item, field, limits.max_document_bytes)


def check_documents(value: Any, limits: RerankLimits) -> tuple[str, ...]:
    if value is None:
        raise RerankRequestError("documents", "is required: a non-empty list of texts")
    if not isinstance(value, list):
        raise RerankRequestError("documents", f"must be a list, got {type(value).__name__}")
    if not value:
        raise RerankRequestError("documents", "is empty; send at least one document")
    if len(value) > limits.max_documents:
        raise RerankRequestError(
            "documents",
            f"has {len(value)} items; at most {limits.max_documents} are allowed per request "
            "(split the list)",
        )
    return tuple(check_document(item, i, limits) for i, item in enumerate(value))


def check_top_n(value: Any, count: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RerankRequestError("top_n", f"must be an integer, got {shown(value)}")
    if value <= 0:
        raise RerankRequestError("top_n", f"must be >= 1, got {value}")
    return min(value, count)  # more than the documents: every document (as Cohere)


def _flag(value: Any, field: str, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RerankRequestError(field, f"must be true or false, got {shown(value)}")
    return value


def parse_request(body: Any, limits: RerankLimits, api: str = COHERE) -> RerankRequest:
    """Validate a JSON-decoded rerank body of ``api`` (:data:`APIS`) against ``limits``.

    Raises :class:`RerankRequestError` naming the field: not an object, an unknown or
    unsupported field, no or blank query, no/too many documents, a non-string or too long
    document, ``top_n`` not a positive integer, ``return_documents`` not a boolean.
    """
    if api not in APIS:
        raise ValueError(f"api {api!r} is not one of {APIS}")
    if not isinstance(body, Mapping):
        raise RerankRequestError("body", f"must be a JSON object, got {type(body).__name__}")
    for key in body:
        if key not in KNOWN_FIELDS:
            raise RerankRequestError(str(key), f"is not a field of {api}'s rerank request")
    for key in UNSUPPORTED_FIELDS:
        if body.get(key) is not None:
            raise RerankRequestError(key, "is not supported by this server; leave it out")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RerankRequestError("model", f"must be a string, got {type(model).__name__}")
    if body.get("query") is None:
        raise RerankRequestError("query", "is required: the text the documents are ranked for")
    query = check_text(body["query"], "query", limits.max_query_bytes)
    documents = check_documents(body.get("documents"), limits)
    return RerankRequest(
        query=query,
        documents=documents,
        top_n=check_top_n(body.get("top_n"), len(documents)),
        return_documents=_flag(
            body.get("return_documents"), "return_documents", RETURN_DOCUMENTS_DEFAULT[api]
        ),
        model=model,
        api=api,
    )


def _results(request: RerankRequest, ranked: Sequence[Ranked]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for r in ranked:
        item: dict[str, Any] = {"index": r.index, "relevance_score": r.relevance_score}
        if request.return_documents:
            item["document"] = {"text": request.documents[r.index]}
        out.append(item)
    return out


def render_response(
    request: RerankRequest,
    ranked: Sequence[Ranked],
    model: str,
    input_tokens: int,
    response_id: str,
) -> dict[str, Any]:
    """The response body of ``request.api``: ``results`` (as ranked: best first, cut to
    ``top_n``) of ``{index, relevance_score, document?}``, plus Cohere's ``id``/``meta`` or
    Jina's ``model``/``usage``."""
    results = _results(request, ranked)
    if request.api == JINA:
        usage = {"total_tokens": input_tokens, "prompt_tokens": input_tokens}
        return {"model": model, "usage": usage, "results": results}
    meta = {
        "api_version": {"version": "2"},
        "billed_units": {"search_units": 1},
        "tokens": {"input_tokens": input_tokens, "output_tokens": 0},
    }
    return {"id": response_id, "results": results, "meta": meta}
