"""The rerank task's client side: ``rerank_flow`` (the client's ``.rerank(query, documents,
top_n=None)``), ``tritonforge client rerank`` and ``show`` (``make run``'s demo).

The served reranker is discovered from the server's configs (the ensemble or the BLS marked with
the task; names, tensors, limits and the ``top_n`` parameter from their ``parameters``); the
request is checked here with the same rules as the server's (:func:`protocol.parse_request`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tritonforge.client.errors import InvalidRequestError, ModelNotFoundError
from tritonforge.pipelines import ROLE_KEY, TASK_KEY, config_params
from tritonforge.tasks.rerank.protocol import (
    Ranked,
    RerankLimits,
    RerankRequestError,
    parse_request,
)
from tritonforge.tasks.rerank.scores import ranked
from tritonforge.tasks.rerank.spec import TASK

if TYPE_CHECKING:
    from tritonforge.client.core import BaseClient, Flow

LIMIT_KEYS = ("max_documents", "max_document_bytes", "max_query_bytes")
Emit = Callable[[str], None]


@dataclass(frozen=True)
class Reranker:
    """One served rerank route: its model, request tensors, outputs and bounds."""

    model: str
    route: str  # ensemble | bls
    query_input: str
    documents_input: str
    outputs: tuple[str, str, str]  # scores, logits, ranking
    top_n_parameter: str
    limits: RerankLimits


def served(configs: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], Reranker]:
    """``(model, route)`` -> :class:`Reranker` of each rerank ensemble and BLS served."""
    by_name = {str(c.get("name")): c for c in configs}
    out: dict[tuple[str, str], Reranker] = {}
    for config in configs:
        p = config_params(config)
        route = p.get(ROLE_KEY, "")
        if p.get(TASK_KEY) != TASK or route not in ("ensemble", "bls"):
            continue
        if route == "ensemble":  # its bounds are its pair tokenizer's (the first step)
            first = config["ensemble_scheduling"]["step"][0]["model_name"]
            p = {**config_params(by_name.get(first, {})), **p}
        names = [str(t["name"]) for t in config.get("output", [])]
        outputs = (names[0], names[1], names[2])
        name = str(config["name"])
        out[(name, route)] = Reranker(
            name,
            route,
            p["query_input"],
            p["documents_input"],
            outputs,
            p["top_n_parameter"],
            RerankLimits(*(int(p[k]) for k in LIMIT_KEYS)),
        )
    return out


def pick(found: Mapping[tuple[str, str], Reranker], name: str | None, route: str) -> Reranker:
    """The reranker ``name`` (default: the only one) on ``route``."""
    matches = [r for (m, rt), r in found.items() if rt == route and (name in (None, m))]
    if len(matches) != 1:
        served_names = sorted(f"{m} ({rt})" for m, rt in found)
        raise ModelNotFoundError(
            f"no single rerank model {name or ''!r} on route {route!r}; served: {served_names}"
        )
    return matches[0]


def rerank_flow(
    client: BaseClient,
    query: str,
    documents: Sequence[str],
    top_n: int | None = None,
    name: str | None = None,
    route: str = "ensemble",
    traceparent: str | None = None,
) -> Flow[list[Ranked]]:
    """The documents best first (``index`` into ``documents``, ``relevance_score`` = sigmoid of
    the logit), cut to ``top_n``; one request. A bad argument is an InvalidRequestError naming
    the field (the server's rules) before anything is sent."""
    configs = yield from client.served_configs_flow()
    target = pick(served(configs), name, route)
    body: dict[str, Any] = {"query": query, "documents": list(documents)}
    if top_n is not None:
        body["top_n"] = top_n
    try:
        req = parse_request(body, target.limits)
    except RerankRequestError as e:
        raise InvalidRequestError(f"{e.field}: {e.detail}") from e
    module = client.tritonclient
    inputs = []
    for tensor, values in (
        (target.query_input, [req.query]),
        (target.documents_input, req.documents),
    ):
        data = np.array([v.encode("utf-8") for v in values], dtype=np.object_)
        infer_input = module.InferInput(tensor, [len(values)], "BYTES")
        infer_input.set_data_from_numpy(data)
        inputs.append(infer_input)
    outputs = [module.InferRequestedOutput(n) for n in target.outputs]
    parameters = {} if req.top_n is None else {target.top_n_parameter: req.top_n}
    call = client.infer_call(target.model, inputs, outputs, parameters, client.trace(traceparent))
    result = yield call
    scores, logits, order = (result.as_numpy(n) for n in target.outputs)
    return ranked(scores, logits, order)


def add_parser(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    """``tritonforge client rerank QUERY DOC...``."""
    p = sub.add_parser("rerank", help="rank documents by relevance to a query (cross-encoder)")
    p.add_argument("query")
    p.add_argument("documents", nargs="+")
    p.add_argument("--top-n", type=int, help="the best N documents only")
    p.add_argument("--model", help="the rerank model (default: the only one served)")
    common(p)
    p.set_defaults(func=cmd_rerank)


def cmd_rerank(args: argparse.Namespace) -> dict[str, Any]:
    with args.open_client(args) as c:
        route = "bls" if c.settings.route == "bls" else "ensemble"
        results = c.rerank(args.query, args.documents, args.top_n, args.model, route)
        return {
            "query": args.query,
            "results": [
                {
                    "index": r.index,
                    "relevance_score": round(r.relevance_score, 6),
                    "document": args.documents[r.index],
                }
                for r in results
            ],
        }


QUERY = "how does the server batch requests?"
DOCUMENTS = (
    "A cat sleeps on the warm windowsill.",
    "The dynamic batcher merges queued requests into one batch before the model runs.",
    "Shares dropped at the opening bell.",
    "Requests wait in a queue until the scheduler forms a batch.",
)


def show(open_client: Callable[..., Any], pipeline: object, emit: Emit) -> None:
    """Rerank :data:`DOCUMENTS` for :data:`QUERY` over HTTP (ensemble) and gRPC (BLS);
    ``pipeline``: unused (the pipeline tasks' ``show`` signature)."""
    with open_client("http") as c:
        try:
            results = c.rerank(QUERY, list(DOCUMENTS))
        except ModelNotFoundError as e:
            emit(f"\n==> rerank: not served ({e}); `tritonforge export msmarco` exports it")
            return
    emit(f"\n==> rerank (HTTP, ensemble): {QUERY!r}")
    for r in results:
        emit(f"  {r.relevance_score:.4f}  [{r.index}] {DOCUMENTS[r.index]}")
    with open_client("grpc", "bls") as c:
        bls = c.rerank(QUERY, list(DOCUMENTS), route="bls")
    same = [r.index for r in bls] == [r.index for r in results]
    emit(f"==> rerank_bls over gRPC: same order: {same}\n")


# the client methods this task adds (client.core.install_task_methods)
METHODS: dict[str, Callable[..., Any]] = {"rerank": rerank_flow}
