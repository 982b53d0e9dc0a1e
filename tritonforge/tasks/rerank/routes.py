"""The front's rerank routes: Cohere ``/v1/rerank`` and ``/v2/rerank`` (ClientV2 posts there),
Jina ``/rerank``; each parses the body (:func:`protocol.parse_request`, bounds from the served
pair tokenizer's config), runs one v2 ``infer`` of the ``rerank`` ensemble over the front's
upstream and renders the API's response. ``served_models`` puts each rerank ensemble in
``/v1/models`` with its task."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from tritonforge.pipelines import ROLE_KEY, TASK_KEY, config_params
from tritonforge.runtime.errors import OpenAIError
from tritonforge.runtime.front.openai.catalog import ServedModel
from tritonforge.runtime.front.openai.responses import new_id
from tritonforge.tasks.rerank.pairs import PairTokenizer
from tritonforge.tasks.rerank.protocol import (
    COHERE,
    JINA,
    RerankLimits,
    RerankRequest,
    RerankRequestError,
    parse_request,
    render_response,
)
from tritonforge.tasks.rerank.scores import ranked
from tritonforge.tasks.rerank.spec import TASK

if TYPE_CHECKING:
    from tritonforge.runtime.front.openai.app import OpenAIFront

LIMIT_KEYS = ("max_documents", "max_document_bytes", "max_query_bytes")


def served_models(configs: Iterable[Mapping[str, Any]]) -> dict[str, ServedModel]:
    """Each rerank ensemble, under its own name; ``params``: its pair tokenizer's (the first
    step's) parameters (the limits and the tokenization) and its own (``top_n_parameter``)."""
    configs = list(configs)
    by_name = {str(c.get("name")): c for c in configs}
    out: dict[str, ServedModel] = {}
    for config in configs:
        marks = config_params(config)
        if marks.get(TASK_KEY) != TASK or marks.get(ROLE_KEY) != "ensemble":
            continue
        name = str(config["name"])
        steps = (config.get("ensemble_scheduling") or {}).get("step") or [{}]
        tokenizer = str(steps[0].get("model_name", ""))
        out[name] = ServedModel(
            id=name,
            kind=TASK,
            triton_model=name,
            pipeline=name,
            tokenizer_model=tokenizer,
            params={**config_params(by_name.get(tokenizer, {})), **marks},
        )
    return out


def _model(models: Mapping[str, ServedModel], body: Any) -> ServedModel:
    """The rerank model ``body["model"]`` names; the only one served when it names none."""
    served = sorted(m.id for m in models.values() if m.kind == TASK)
    name = body.get("model") if isinstance(body, Mapping) else None
    if name is None and len(served) == 1:
        return models[served[0]]
    model = models.get(name) if isinstance(name, str) else None
    if model is None or model.kind != TASK:
        raise OpenAIError(f"'model' must name a rerank model: {served}", 400, "model")
    return model


def infer_body(model: ServedModel, request: RerankRequest) -> dict[str, Any]:
    """The v2 request of the ensemble: query [1], documents [n], ``top_n`` as a parameter."""
    query, documents = model.params["query_input"], model.params["documents_input"]
    body: dict[str, Any] = {
        "inputs": [
            {"name": query, "shape": [1], "datatype": "BYTES", "data": [request.query]},
            {
                "name": documents,
                "shape": [len(request.documents)],
                "datatype": "BYTES",
                "data": list(request.documents),
            },
        ]
    }
    if request.top_n is not None:
        body["parameters"] = {model.params["top_n_parameter"]: request.top_n}
    return body


def outputs(data: bytes) -> dict[str, list[Any]]:
    """The JSON outputs of a v2 response, by name."""
    return {o["name"]: o["data"] for o in json.loads(data)["outputs"]}


def _tokenizer(front: OpenAIFront, model: ServedModel) -> PairTokenizer:
    p = model.params
    root = front.settings.model_repository / model.tokenizer_model
    path = root / "1" / p["tokenizer_file"]
    return front.cached(
        path,
        lambda: PairTokenizer(Path(path), int(p["max_length"]), p.get("truncation") or None),
    )


async def rerank(front: OpenAIFront, request: web.BaseRequest, body: Any, api: str) -> web.Response:
    model = _model(await front.models(), body)
    limits = RerankLimits(*(model.param_int(k) for k in LIMIT_KEYS))
    try:
        req = parse_request(body, limits, api)
    except RerankRequestError as e:
        raise OpenAIError(str(e), 400, e.field) from e
    data, _ = await front.infer(model.triton_model, infer_body(model, req))
    got = outputs(data)
    results = ranked(got["scores"], got["logits"], got["ranking"])
    tokenizer = _tokenizer(front, model)
    encoded = await asyncio.to_thread(tokenizer.encode, req.query, list(req.documents))
    tokens = int(sum(int(v) for v in encoded["attention_mask"].reshape(-1)))
    answer = render_response(req, results, model.id, tokens, new_id("rerank"))
    return web.json_response(answer, headers={"X-Triton-Model": model.triton_model})


ROUTES = {
    "/v1/rerank": functools.partial(rerank, api=COHERE),
    "/v2/rerank": functools.partial(rerank, api=COHERE),
    "/rerank": functools.partial(rerank, api=JINA),
}
