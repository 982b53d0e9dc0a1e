"""The ``/v1`` model catalog, discovered from the served configs: one model id per embedding
variant (the fp32 ensemble under the pipeline's name, the others as ``<pipeline>-<variant>``) and
each decoupled model following the Triton generate convention under its own name."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from types import ModuleType
from typing import Any

from tritonforge import tasks
from tritonforge.generation import FINISH_REASON, TEXT_INPUT, TEXT_OUTPUT
from tritonforge.pipelines import PIPELINE_KEY, ROLE_KEY, config_params, discover
from tritonforge.runtime.errors import OpenAIError

# the /v1 model kinds, from the registry: the task whose ensembles are /v1/embeddings models
# (``Task.openai_embeddings``) and the generators' task; a task's routes add their own kinds
EMBEDDING = next(t.name for t in tasks.registry().values() if t.openai_embeddings)
GENERATION = tasks.default(tasks.GENERATOR).name


@dataclass(frozen=True)
class ServedModel:
    """One ``/v1`` model id and the Triton model behind it; ``params``: its config parameters."""

    id: str
    kind: str  # EMBEDDING | GENERATION
    triton_model: str
    pipeline: str
    variant: str = ""
    input: str = TEXT_INPUT
    output: str = TEXT_OUTPUT
    dim: int = 0
    max_items: int = 1
    max_text_bytes: int = 0
    tokenizer_model: str = ""  # embeddings: the pipeline's tokenizer model (usage counts)
    params: Mapping[str, str] = field(default_factory=dict)

    def param_int(self, key: str) -> int:
        try:
            return int(self.params[key])
        except (KeyError, ValueError) as e:
            raise OpenAIError(
                f"model {self.id!r}: its config has no integer parameter {key!r}", 500
            ) from e


def is_generator(config: Mapping[str, Any]) -> bool:
    """A decoupled model following the Triton generate convention."""
    policy = config.get("model_transaction_policy") or {}
    inputs = {str(t.get("name")) for t in config.get("input", [])}
    outputs = {str(t.get("name")) for t in config.get("output", [])}
    return (
        bool(policy.get("decoupled"))
        and TEXT_INPUT in inputs
        and {TEXT_OUTPUT, FINISH_REASON} <= outputs
    )


def embedding_model_id(pipeline: str, variant: str) -> str:
    return pipeline if variant == "fp32" else f"{pipeline}-{variant}"


def catalog(configs: Iterable[Mapping[str, Any]]) -> dict[str, ServedModel]:
    """The ``/v1`` models of the served ``configs`` (Triton's JSON model configs), by id."""
    configs = list(configs)
    out: dict[str, ServedModel] = {}
    tokenizers = {
        p[PIPELINE_KEY]: str(c["name"])
        for c in configs
        if (p := config_params(c)).get(ROLE_KEY) == "tokenizer" and PIPELINE_KEY in p
    }
    for name, pipeline in discover(configs).items():
        if not tasks.get(pipeline.task).openai_embeddings:
            continue  # e.g. classification stays on v2
        for variant, model in pipeline.ensembles.items():
            mid = embedding_model_id(name, variant)
            out[mid] = ServedModel(
                id=mid,
                kind=EMBEDDING,
                triton_model=model,
                pipeline=name,
                variant=variant,
                input=pipeline.input,
                output=pipeline.outputs[0].name,
                dim=pipeline.dim,
                max_items=pipeline.max_items,
                max_text_bytes=pipeline.max_text_bytes,
                tokenizer_model=tokenizers.get(name, ""),
            )
    for config in configs:
        if is_generator(config):
            params = config_params(config)
            name = str(config["name"])
            out[name] = ServedModel(
                id=name,
                kind=GENERATION,
                triton_model=name,
                pipeline=params.get(PIPELINE_KEY, name),
                variant=params.get("variant", ""),
                params=params,
            )
    for routes in task_routes():
        out.update(routes.served_models(configs))
    return dict(sorted(out.items()))


@cache
def generation_routes() -> ModuleType:
    """The generation task's ``/v1`` pieces (structured output, ``n``, logprobs)."""
    return tasks.get(GENERATION).module("routes")


@cache
def task_routes() -> tuple[ModuleType, ...]:
    """The registered tasks' ``routes`` modules: each has ``served_models(configs)`` (its
    catalog entries) and ``ROUTES`` (path -> ``async handler(front, request, body)``)."""
    found = (f"{t.package}.routes" for t in tasks.registry().values())
    return tuple(
        importlib.import_module(m) for m in found if importlib.util.find_spec(m) is not None
    )


@cache
def task_handlers() -> dict[str, Callable[..., Any]]:
    """Every task route: path -> handler (read once; the front asks on every request)."""
    return {path: h for routes in task_routes() for path, h in routes.ROUTES.items()}


def models_list(models: Mapping[str, ServedModel], created: int) -> dict[str, Any]:
    """``GET /v1/models``."""
    return {"object": "list", "data": [model_card(m, created) for m in models.values()]}


def model_card(model: ServedModel, created: int) -> dict[str, Any]:
    return {
        "id": model.id,
        "object": "model",
        "created": created,
        "owned_by": "tritonforge",
        # Extensions (ignored by OpenAI clients): what serves the id.
        "triton_model": model.triton_model,
        "task": model.kind,
    }


def resolve(models: Mapping[str, ServedModel], body: Mapping[str, Any], kind: str) -> ServedModel:
    """The served model ``body["model"]`` names (the Triton model name is accepted too)."""
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise OpenAIError("'model' is required: a model id from GET /v1/models", 400, "model")
    model = models.get(name) or next((m for m in models.values() if m.triton_model == name), None)
    of_kind = sorted(m.id for m in models.values() if m.kind == kind)
    if model is None or model.kind != kind:
        what = "not served" if model is None else f"a {model.kind} model, not {kind}"
        raise OpenAIError(
            f"model {name[:64]!r} is {what}; {kind} models: {of_kind}",
            404,
            "model",
            "model_not_found",
        )
    return model
