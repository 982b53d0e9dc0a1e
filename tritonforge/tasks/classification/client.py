"""Typed classification results and their request/response plumbing (sync and async share it).

A classification pipeline's public outputs (discovered: :attr:`Pipeline.outputs`) are ``label``,
``score``, ``probabilities`` (one per label, index order), ``top_labels`` and ``top_scores``; a
response may also carry which model version answered (a ``model_version`` output, or a response
parameter of that name). The BLS takes ``top_k`` and ``version`` as request parameters; an
ensemble answers with its configured top-k, so a larger ``top_k`` is ranked here from the
probabilities (same order as the server: most probable first, ties by lower index).
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from tritonforge.classify import TOP_K_PARAMETER, check_top_k
from tritonforge.client.discovery import check_limits
from tritonforge.client.errors import InvalidRequestError, ResponseError
from tritonforge.errors import InvalidInputError
from tritonforge.pipelines import Pipeline
from tritonforge.tasks.classification import NAME

if TYPE_CHECKING:
    from tritonforge.client.core import BaseClient, Flow
    from tritonforge.client.sync import EmbeddingClient

VERSION_PARAMETER = "version"  # the BLS's request parameter
VERSION_OUTPUT = "model_version"  # optional output / response parameter: which version answered
REQUIRED = ("label", "score", "probabilities")
# the result types ``tritonforge.client`` exports too
EXPORTS = ("Classification", "Ranked")


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
    if pipeline.task != NAME or not pipeline.labels or missing:
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


# ``make run``'s demo of a classification pipeline (runtime.cli.demo.show calls it)
# (protocol, route) -> a typed client of the demo's server
OpenClient = Callable[..., "EmbeddingClient"]
Emit = Callable[[str], None]  # where the demo writes its lines (runtime.cli.demo: stdout)
SENTENCES = (
    "I love how fast and friendly the support team was.",
    "The package arrived on Tuesday.",
    "This is the worst update they have ever shipped.",
)


def show(open_client: OpenClient, pipeline: Pipeline, emit: Emit) -> None:
    """Classify :data:`SENTENCES` via the ensemble (HTTP) and the BLS (gRPC)."""
    texts = list(SENTENCES)
    k = min(2, len(pipeline.labels))
    with open_client("http") as c:
        results = c.classify(texts, top_k=k, name=pipeline.name)
    emit(
        f"\n==> {pipeline.name}: classified {len(texts)} sentences through "
        f"{pipeline.model('fp32')!r} (HTTP), labels {list(pipeline.labels)}"
    )
    for text, r in zip(texts, results, strict=True):
        top = ", ".join(f"{t.label} {t.score:.3f}" for t in r.top)
        emit(f"  {text!r:56} -> {r.label} ({r.score:.3f}); top {k}: {top}")
    if pipeline.bls is None:
        return
    # Like with like: the ensemble answers with the latest version, so the BLS is pinned to it
    # (unpinned, the BLS would split traffic between the versions: shown separately below).
    pinned = pipeline.latest_version
    with open_client("grpc", "bls") as c:
        bls = c.classify(texts, top_k=k, name=pipeline.name, version=pinned)
    gap = max(
        abs(a.probabilities[label] - b.probabilities[label])
        for a, b in zip(results, bls, strict=True)
        for label in pipeline.labels
    )
    same = sum(a.label == b.label for a, b in zip(results, bls, strict=True))
    both = "" if pinned is None else f", both at version {pinned}"
    emit(
        f"==> {pipeline.bls} over gRPC{both}: {same}/{len(texts)} labels agree, "
        f"max |ensemble - BLS| probability = {gap:.2e}"
    )
    if pipeline.version_weights:
        show_canary_split(open_client, pipeline, emit)
    emit("")


CANARY_REQUESTS = 20


def format_split(answered: Sequence[str | None], weights: Mapping[int, int]) -> str:
    """``"v1 16/20 (80%), v2 4/20 (20%)"``: which version answered each unpinned request,
    next to the configured split."""
    counts = Counter(str(v) for v in answered)
    n = len(answered)
    return ", ".join(
        f"v{v} {counts.get(str(v), 0)}/{n} (configured {p}%)" for v, p in sorted(weights.items())
    )


def show_canary_split(open_client: OpenClient, pipeline: Pipeline, emit: Emit) -> None:
    """:data:`CANARY_REQUESTS` unpinned one-text requests through the BLS: which version
    answered each (the canary split by request), against the configured weights."""
    texts = [f"{SENTENCES[i % len(SENTENCES)]} (#{i})" for i in range(CANARY_REQUESTS)]
    with open_client("grpc", "bls") as c:
        answered = [c.classify([t], name=pipeline.name)[0].model_version for t in texts]
    emit(
        f"==> {pipeline.bls} unpinned (canary split): "
        f"{format_split(answered, pipeline.version_weights)}"
    )


def classify_flow(
    client: BaseClient,
    texts: Sequence[str] | str,
    top_k: int | None = None,
    version: int | str | None = None,
    variant: str | None = None,
    route: str | None = None,
    name: str | None = None,
    traceparent: str | None = None,
    *,
    pipeline: str | None = None,
) -> Flow[list[Classification]]:
    """One :class:`Classification` per text, in order (at most the pipeline's ``max_items``
    texts: one request). ``top_k`` (1..classes) sizes ``top``; ``version`` pins a model
    version (the BLS's ``version`` parameter; an ensemble's ``model_version``).
    ``pipeline``: the old name of ``route``."""
    from tritonforge.client.core import chosen_route
    from tritonforge.client.wire import check_texts, make_inputs, make_outputs

    items = check_texts(texts)
    orchestration = chosen_route(route, pipeline)
    resolved = yield from client.resolve_flow(NAME, name, orchestration, variant)
    target, model, parameters = resolved
    k, extra_params, extra = prepare(
        target, items, orchestration or client.settings.route, top_k, version
    )
    call = client.infer_call(
        model,
        make_inputs(client.tritonclient, items, target.input),
        make_outputs(client.tritonclient, output_names(target, model)),
        {**parameters, **extra_params},
        client.trace(traceparent),
        extra,
    )
    result = yield call
    return decode(result, target, len(items), k, client.context(model))


# the client methods this task adds (client.core.install_task_methods)
METHODS: dict[str, Callable[..., Any]] = {"classify": classify_flow}


def add_parser(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    """``tritonforge client classify TEXT...``."""
    p = sub.add_parser("classify", help="classify texts; prints label, score, probabilities")
    p.add_argument("texts", nargs="+")
    p.add_argument("--top-k", type=int, help="best classes per text (1..classes)")
    p.add_argument("--version", help="pin a model version (the BLS's `version` parameter)")
    common(p)
    p.set_defaults(func=cmd_classify)


def cmd_classify(args: argparse.Namespace) -> dict[str, Any]:
    from tritonforge.client.cli import describe, open_client

    with open_client(args) as c:
        results = c.classify(args.texts, top_k=args.top_k, version=args.version)
        return {
            **describe(c, NAME),
            "results": [
                {"text": t, **r.as_dict()} for t, r in zip(args.texts, results, strict=True)
            ],
        }
