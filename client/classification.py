"""Typed classification results and their request/response plumbing (sync and async share it).

A classification pipeline's public outputs (discovered: :attr:`Pipeline.outputs`) are ``label``,
``score``, ``probabilities`` (one per label, index order), ``top_labels`` and ``top_scores``; a
response may also carry which model version answered (a ``model_version`` output, or a response
parameter of that name). The BLS takes ``top_k`` and ``version`` as request parameters; an
ensemble answers with its configured top-k, so a larger ``top_k`` is ranked here from the
probabilities (same order as the server: most probable first, ties by lower index).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from tritonforge.classify import TOP_K_PARAMETER, check_top_k
from tritonforge.client.discovery import check_limits
from tritonforge.client.errors import InvalidRequestError, ResponseError
from tritonforge.errors import InvalidInputError
from tritonforge.pipelines import Pipeline

VERSION_PARAMETER = "version"  # the BLS's request parameter
VERSION_OUTPUT = "model_version"  # optional output / response parameter: which version answered
REQUIRED = ("label", "score", "probabilities")


class Ranked(NamedTuple):
    label: str
    score: float


@dataclass(frozen=True)
class Classification:
    """One text's answer: the best ``label`` and its ``score``, every class probability by label
    (index order), the ``top`` k (most probable first) and, when the response says so, the
    ``model_version`` that answered."""

    label: str
    score: float
    probabilities: dict[str, float]
    top: tuple[Ranked, ...]
    model_version: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "score": self.score,
            "probabilities": self.probabilities,
            "top": [{"label": r.label, "score": r.score} for r in self.top],
            "model_version": self.model_version,
        }


def check_classifier(pipeline: Pipeline) -> Pipeline:
    missing = [n for n in REQUIRED if n not in {o.name for o in pipeline.outputs}]
    if pipeline.task != "classification" or not pipeline.labels or missing:
        raise InvalidRequestError(
            f"pipeline {pipeline.name!r} is not a classifier (task {pipeline.task!r}, "
            f"labels {list(pipeline.labels)}, missing outputs {missing})"
        )
    return pipeline


def checked_top_k(top_k: int | None, pipeline: Pipeline) -> int | None:
    """``top_k`` in ``[1, classes]`` (None: the server's default); the error names ``top_k``."""
    if top_k is None:
        return None
    try:
        return check_top_k(top_k, len(pipeline.labels))
    except InvalidInputError as e:
        raise InvalidRequestError(f"pipeline {pipeline.name!r}: {e}") from e


def request_options(
    orchestration: str, top_k: int | None, version: int | str | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(request parameters, infer() keyword arguments) for a classification call.

    Through the BLS, ``top_k`` and ``version`` are request parameters; an ensemble is pinned with
    the standard ``model_version``.
    """
    parameters: dict[str, Any] = {}
    kwargs: dict[str, Any] = {}
    if version is not None and not str(version).strip():
        raise InvalidRequestError("version must be a non-empty model version, got ''")
    if orchestration == "bls":
        if top_k is not None:
            parameters[TOP_K_PARAMETER] = top_k
        if version is not None:
            parameters[VERSION_PARAMETER] = str(version)
    elif version is not None:
        kwargs["model_version"] = str(version)
    return parameters, kwargs


def output_names(pipeline: Pipeline, model: str) -> list[str]:
    """The outputs to ask ``model`` for: the pipeline's, plus ``model_version`` from a BLS that
    serves several versions (the ensemble, whose outputs discovery reads, has none)."""
    names = [o.name for o in pipeline.outputs]
    if model == pipeline.bls and pipeline.versions and VERSION_OUTPUT not in names:
        names.append(VERSION_OUTPUT)
    return names


def prepare(
    pipeline: Pipeline,
    texts: list[str],
    orchestration: str,
    top_k: int | None,
    version: int | str | None,
) -> tuple[int | None, dict[str, Any], dict[str, Any]]:
    """Check one classification call against the discovered facts (a classifier; ``max_items``,
    ``max_text_bytes``; ``top_k`` in range) and build it: (top_k, request parameters, infer()
    keyword arguments). Every refusal is an :class:`InvalidRequestError` naming the field."""
    check_classifier(pipeline)
    check_limits(texts, pipeline)
    k = checked_top_k(top_k, pipeline)
    parameters, kwargs = request_options(orchestration, k, version)
    return k, parameters, kwargs


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _response_version(result: Any) -> str | None:
    """A ``model_version`` response parameter (HTTP JSON or gRPC), if the server sets one."""
    try:
        response = result.get_response()
    except Exception:  # not every result type exposes it; the version is optional
        return None
    if isinstance(response, Mapping):
        value = (response.get("parameters") or {}).get(VERSION_OUTPUT)
        return None if value is None else str(value)
    params = getattr(response, "parameters", None)
    if params is not None and VERSION_OUTPUT in params:
        p = params[VERSION_OUTPUT]
        kind = p.WhichOneof("parameter_choice")
        return str(getattr(p, kind)) if kind else None
    return None


def rank(probabilities: np.ndarray, labels: tuple[str, ...], k: int) -> tuple[Ranked, ...]:
    order = np.argsort(-probabilities, kind="stable")[:k]
    return tuple(Ranked(labels[i], float(probabilities[i])) for i in order)


def decode(
    result: Any, pipeline: Pipeline, rows: int, top_k: int | None, context: str
) -> list[Classification]:
    """The response as one :class:`Classification` per text; :class:`ResponseError` when it
    breaks the pipeline's contract (missing output, wrong shape, unknown label)."""
    labels = pipeline.labels
    arrays: dict[str, np.ndarray] = {}
    for name in (*REQUIRED, "top_labels", "top_scores", VERSION_OUTPUT):
        value = result.as_numpy(name)
        if value is None and name in REQUIRED:
            raise ResponseError(f"{context}: the response has no {name!r} output")
        if value is not None:
            arrays[name] = np.asarray(value)
    probs = arrays["probabilities"].astype(np.float32)
    if probs.shape != (rows, len(labels)):
        raise ResponseError(
            f"{context}: expected 'probabilities' of shape [{rows}, {len(labels)}], "
            f"got {list(probs.shape)}"
        )
    versions = arrays.get(VERSION_OUTPUT)
    fallback = _response_version(result) if versions is None else None
    out = []
    for i in range(rows):
        label = _text(arrays["label"].reshape(rows, -1)[i, 0])
        if label not in labels:
            raise ResponseError(f"{context}: label {label!r} is not one of {list(labels)}")
        top_names = arrays.get("top_labels")
        k = top_k or (top_names.reshape(rows, -1).shape[1] if top_names is not None else 1)
        if top_names is not None and top_names.reshape(rows, -1).shape[1] >= k:
            scores = arrays["top_scores"].reshape(rows, -1)[i]
            names = top_names.reshape(rows, -1)[i]
            top = tuple(
                Ranked(_text(n), float(s)) for n, s in zip(names[:k], scores[:k], strict=True)
            )
        else:  # an ensemble answers with its configured k: rank the probabilities here
            top = rank(probs[i], labels, k)
        version = fallback
        if versions is not None:
            flat = versions.reshape(-1)
            version = _text(flat[i] if flat.size == rows else flat[0])
        out.append(
            Classification(
                label=label,
                score=float(arrays["score"].reshape(rows, -1)[i, 0]),
                probabilities={lb: float(p) for lb, p in zip(labels, probs[i], strict=True)},
                top=top,
                model_version=version,
            )
        )
    return out
