"""What the rerank stages read from their config and their request tensors, as pure functions.

The pair tokenizer takes a BYTES ``query`` ``[1]`` and BYTES ``documents`` ``[n]`` (one
request = one query's documents, tokenized as one batch); the postprocess takes the encoder's
``[n, 1]`` logits and a request's ``top_n`` parameter. Names and limits come from the model
config (``parameters``, generated from the task's spec), never from literals here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tritonforge.bls_parameters import request_parameters
from tritonforge.errors import ModelConfigError
from tritonforge.modelconfig import ModelConfig
from tritonforge.tasks.rerank.protocol import (
    RerankLimits,
    RerankRequestError,
    check_documents,
    check_text,
    check_top_n,
)


@dataclass(frozen=True)
class PairStage:
    """The pair tokenizer's settings from its config: input names, limits, tokenization."""

    query_input: str
    documents_input: str
    limits: RerankLimits
    max_length: int
    truncation: str | None
    tokenizer_file: str
    outputs: tuple[str, ...]


def pair_stage(config: ModelConfig) -> PairStage:
    """Read :class:`PairStage` from ``parameters`` (``query_input``, ``documents_input``,
    ``max_documents``, ``max_document_bytes``, ``max_query_bytes``, ``max_length``,
    ``truncation`` (optional), ``tokenizer_file``); ModelConfigError when one is missing or
    names no input."""
    query, documents = (
        config.param("query_input", kind=str),
        config.param("documents_input", kind=str),
    )
    names = {t.name for t in config.inputs}
    for name in (query, documents):
        if name not in names:
            raise ModelConfigError(f"model {config.name!r} has no input {name!r} (parameters)")
    try:
        limits = RerankLimits(
            max_documents=config.param("max_documents", kind=int),
            max_document_bytes=config.param("max_document_bytes", kind=int),
            max_query_bytes=config.param("max_query_bytes", kind=int),
        )
    except ValueError as e:
        raise ModelConfigError(f"model {config.name!r}: {e}") from e
    return PairStage(
        query_input=query,
        documents_input=documents,
        limits=limits,
        max_length=config.param("max_length", kind=int),
        truncation=config.parameters.get("truncation") or None,
        tokenizer_file=config.param("tokenizer_file", kind=str),
        outputs=tuple(t.name for t in config.outputs),
    )


def _strings(values: Any, field: str) -> list[Any]:
    items = np.asarray(values, dtype=object).reshape(-1).tolist()
    out = []
    for i, item in enumerate(items):
        if isinstance(item, bytes | bytearray | np.bytes_):
            try:
                item = bytes(item).decode("utf-8")
            except UnicodeDecodeError as e:
                raise RerankRequestError(
                    f"{field}[{i}]", f"is not valid UTF-8 (byte {e.start}); send UTF-8 text"
                ) from e
        out.append(item)
    return out


def decode_pairs(inputs: Mapping[str, np.ndarray], stage: PairStage) -> tuple[str, list[str]]:
    """One request's ``(query, documents)`` from its BYTES tensors, validated against the
    stage's limits; :class:`RerankRequestError` names the tensor (and the item)."""
    if stage.query_input not in inputs:
        raise RerankRequestError(stage.query_input, "is required")
    queries = _strings(inputs[stage.query_input], stage.query_input)
    if len(queries) != 1:
        raise RerankRequestError(
            stage.query_input, f"must hold exactly one text, got {len(queries)}"
        )
    query = check_text(queries[0], stage.query_input, stage.limits.max_query_bytes)
    if stage.documents_input not in inputs:
        raise RerankRequestError(stage.documents_input, "is required")
    documents = _strings(inputs[stage.documents_input], stage.documents_input)
    try:
        return query, list(check_documents(documents, stage.limits))
    except RerankRequestError as e:  # name the tensor, not the HTTP field
        field = e.field.replace("documents", stage.documents_input, 1)
        raise RerankRequestError(field, e.detail) from e


def request_top_n(
    parameters_json: str | Mapping[str, Any] | None, parameter: str, count: int
) -> int | None:
    """The ``top_n`` a request asks for (a request parameter; an ensemble forwards its
    parameters), cut to ``count``; None = every document."""
    params = request_parameters(parameters_json)
    try:
        return check_top_n(params.get(parameter), count)
    except RerankRequestError as e:
        raise RerankRequestError(parameter, e.detail) from e
