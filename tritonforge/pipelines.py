"""Pipelines discovered from model configs: what clients, load tests and probes read.

Export generates every config of a pipeline from its spec (:mod:`export.pipeline_spec`) and marks
each model with ``tritonforge.*`` parameters (:data:`PIPELINE_KEY` and friends). This module reads
them back, from a repository on disk or from a running server's configs, so no consumer restates a
model name, a variant list, an output dimension or a label. Only the standard library is needed
(the Triton container imports this too).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tritonforge import tasks

VARIANTS = ("fp32", "int8", "torchscript")

PIPELINE_KEY = "tritonforge.pipeline"
TASK_KEY = "tritonforge.task"
# Triton's request priority (a reserved request parameter): 1 is served first; requests without
# one get the last of the pipeline's levels (PipelineSpec.priority_levels), bulk traffic.
PRIORITY_PARAMETER = "priority"
TOP_PRIORITY = 1
ROLE_KEY = "tritonforge.role"  # tokenizer | encoder | fused | postprocess | ensemble | bls
VARIANT_KEY = "tritonforge.variant"  # encoders and ensembles
LABELS_KEY = "tritonforge.labels"  # classification: JSON list, index order
# A pipeline's routes: how a request is orchestrated, by a Triton ensemble (one model per
# variant) or by the BLS model (one model, the variant a request parameter). The public models'
# roles are the routes.
ENSEMBLE_ROUTE, BLS_ROUTE = "ensemble", "bls"
ROUTES = (ENSEMBLE_ROUTE, BLS_ROUTE)
PUBLIC_ROLES = ROUTES
# The request parameter that picks (BLS) or pins (generate) a variant.
VARIANT_PARAMETER = "variant"
# Generation models (decoupled ``generate``): one model per variant, grouped by name.
GENERATOR_ROLE = "generator"
GENERATOR_KEY = "tritonforge.generator"  # the group: the default variant's model name
DEFAULT_VARIANT_KEY = "tritonforge.default_variant"
GENERATION_VARIANTS = ("fp32", "int8")


def generator_name(base: str, variant: str, default_variant: str) -> str:
    """The model serving ``variant`` of the generator ``base``: ``base`` for the default
    variant, ``<base>_<variant>`` for any other (so ``generate`` is always the recommended one)."""
    return base if variant == default_variant else f"{base}_{variant}"


@dataclass(frozen=True)
class StageNames:
    """The model names of one pipeline (the naming rule lives here and nowhere else)."""

    pipeline: str
    prefix: str

    def tokenizer(self) -> str:
        return f"{self.prefix}tokenizer"

    def encoder(self, variant: str) -> str:
        return f"{self.prefix}encoder_{variant}"

    def postprocess(self) -> str:
        return f"{self.prefix}postprocess"

    def fused(self, variant: str) -> str:
        """Tokenizer + encoder (+ postprocess) in one model: the ensemble's one step."""
        return f"{self.prefix}fused_{variant}"

    def ensemble(self, variant: str) -> str:
        return self.pipeline if variant == "fp32" else f"{self.pipeline}_{variant}"

    def bls(self) -> str:
        return f"{self.pipeline}_bls"


@dataclass(frozen=True)
class Output:
    name: str
    datatype: str  # the protocol's spelling: FP32, BYTES, ...
    dims: tuple[int, ...]  # without the batch axis; -1 is variable


@dataclass(frozen=True)
class Pipeline:
    """One pipeline as its public models declare it."""

    name: str
    task: str
    ensembles: Mapping[str, str]  # variant -> ensemble model
    bls: str | None
    bls_variants: tuple[str, ...]
    input: str
    outputs: tuple[Output, ...]
    labels: tuple[str, ...] = ()
    max_items: int = 1
    max_text_bytes: int = 0
    models: tuple[str, ...] = field(default_factory=tuple)  # every model of the pipeline
    versions: tuple[int, ...] = ()  # the BLS's encoder versions when several are served
    version_weights: Mapping[int, int] = field(default_factory=dict)  # its canary split, percent

    @property
    def variants(self) -> tuple[str, ...]:
        """Variants served through an ensemble (the BLS may list more, exported or not)."""
        return tuple(v for v in VARIANTS if v in self.ensembles)

    @property
    def latest_version(self) -> int | None:
        """The encoder version an ensemble answers with (Triton's latest), when several."""
        return max(self.versions) if self.versions else None

    @property
    def public_models(self) -> tuple[str, ...]:
        return (*self.ensembles.values(), *((self.bls,) if self.bls else ()))

    def model(self, variant: str = "fp32", bls: bool = False, *, route: str | None = None) -> str:
        """The model to call for ``variant`` on ``route`` (one of :data:`ROUTES`; ``bls=True``
        is ``route="bls"``, the default the ensemble); :class:`KeyError` naming the choices."""
        route = route or (BLS_ROUTE if bls else ENSEMBLE_ROUTE)
        if route not in ROUTES:
            raise KeyError(f"unknown route={route!r}; use one of {list(ROUTES)}")
        if route == BLS_ROUTE:
            if self.bls is None:
                raise KeyError(f"pipeline {self.name!r} has no BLS model")
            return self.bls
        try:
            return self.ensembles[variant]
        except KeyError as e:
            raise KeyError(
                f"pipeline {self.name!r} has no {variant!r} ensemble; it has {list(self.variants)}"
            ) from e

    def output(self, name: str) -> Output:
        for out in self.outputs:
            if out.name == name:
                return out
        raise KeyError(f"pipeline {self.name!r} has no output {name!r}")

    @property
    def dim(self) -> int:
        """Embeddings: the vector size; classifiers: the number of classes."""
        summary = tasks.get(self.task).summary_output
        first = self.outputs[0] if summary is None else self.output(summary)
        return int(first.dims[-1])


def config_params(config: Mapping[str, Any]) -> dict[str, str]:
    """A config's ``parameters`` as plain strings (Triton's JSON form or the parsed one)."""
    return {
        str(k): str(v.get("string_value", "")) if isinstance(v, Mapping) else str(v)
        for k, v in (config.get("parameters") or {}).items()
    }


_params = config_params  # the old private name


def _wire(data_type: str) -> str:
    name = str(data_type).removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def discover(configs: Iterable[Mapping[str, Any]]) -> dict[str, Pipeline]:
    """Pipelines declared by ``configs`` (Triton's JSON form of each model config), by name.

    Models without ``tritonforge.*`` parameters are ignored (a repository may hold others).
    """
    members: dict[str, list[tuple[dict[str, str], Mapping[str, Any]]]] = {}
    for config in configs:
        params = _params(config)
        if PIPELINE_KEY in params:
            members.setdefault(params[PIPELINE_KEY], []).append((params, config))
    pipelines: dict[str, Pipeline] = {}
    for name, models in sorted(members.items()):
        public = [(p, c) for p, c in models if p.get(ROLE_KEY) in PUBLIC_ROLES]
        if not public:
            continue
        ensembles = {
            p[VARIANT_KEY]: str(c["name"]) for p, c in public if p.get(ROLE_KEY) == "ensemble"
        }
        bls = next(((p, c) for p, c in public if p.get(ROLE_KEY) == "bls"), None)
        params, first = public[0]
        pipelines[name] = Pipeline(
            name=name,
            task=params.get(TASK_KEY) or tasks.default().name,
            ensembles=dict(sorted(ensembles.items(), key=lambda kv: VARIANTS.index(kv[0]))),
            bls=str(bls[1]["name"]) if bls else None,
            bls_variants=tuple(
                v.split("=", 1)[0].strip()
                for v in (bls[0].get("encoder_models", "") if bls else "").split(",")
                if v.strip()
            ),
            input=str(first["input"][0]["name"]),
            outputs=tuple(
                Output(str(o["name"]), _wire(o.get("data_type", "")), tuple(o.get("dims", [])))
                for o in first.get("output", [])
            ),
            labels=tuple(json.loads(params[LABELS_KEY])) if LABELS_KEY in params else (),
            max_items=int(params.get("max_items") or first.get("max_batch_size", 1) or 1),
            max_text_bytes=int(params.get("max_text_bytes") or 0),
            models=tuple(sorted(str(c["name"]) for _, c in models)),
            versions=tuple(
                int(v) for v in (bls[0].get("versions", "") if bls else "").split(",") if v.strip()
            ),
            version_weights={
                int(k): int(v)
                for k, _, v in (
                    item.partition("=")
                    for item in (bls[0].get("version_weights", "") if bls else "").split(",")
                    if item.strip()
                )
            },
        )
    return pipelines


def repository_configs(repository: Path) -> list[dict[str, Any]]:
    """Every ``<model>/config.pbtxt`` of a repository in JSON form (needs ``tritonclient``)."""
    from tritonforge.modelconfig import pbtxt_to_dict

    configs = []
    for path in sorted(Path(repository).glob("*/config.pbtxt")):
        if not path.parent.name.startswith("."):
            configs.append(pbtxt_to_dict(path.read_text()))
    return configs


def from_repository(repository: Path) -> dict[str, Pipeline]:
    """The pipelines a model repository on disk declares."""
    return discover(repository_configs(repository))


def pipeline_models(repository: Path) -> list[str]:
    """Every model directory of ``repository`` whose config marks it as part of a pipeline."""
    return sorted(
        str(c["name"]) for c in repository_configs(repository) if PIPELINE_KEY in _params(c)
    )


@dataclass(frozen=True)
class Generator:
    """One generation model group: variant -> model (each variant is its own Triton model, so
    Triton's per-model metrics describe one decoder) and the recommended default."""

    name: str
    models: Mapping[str, str]
    default_variant: str

    @property
    def variants(self) -> tuple[str, ...]:
        return tuple(self.models)

    def model(self, variant: str | None = None) -> str:
        """The model for ``variant`` (None: the default); :class:`KeyError` naming the choices."""
        variant = variant or self.default_variant
        try:
            return self.models[variant]
        except KeyError as e:
            raise KeyError(
                f"unknown variant={variant!r} for {self.name!r}; it serves {list(self.models)}"
            ) from e


def discover_generators(configs: Iterable[Mapping[str, Any]]) -> dict[str, Generator]:
    """Generation model groups declared by ``configs`` (``tritonforge.role`` = generator)."""
    groups: dict[str, dict[str, tuple[str, str]]] = {}
    for config in configs:
        params = _params(config)
        if params.get(ROLE_KEY) != GENERATOR_ROLE:
            continue
        group = params.get(GENERATOR_KEY) or str(config["name"])
        variant = params.get(VARIANT_KEY, "fp32")
        groups.setdefault(group, {})[variant] = (
            str(config["name"]),
            params.get(DEFAULT_VARIANT_KEY, "fp32"),
        )
    out = {}
    for name, members in sorted(groups.items()):
        order = sorted(members, key=lambda v: (v not in GENERATION_VARIANTS, v))
        models = {v: members[v][0] for v in order}
        default = members[order[0]][1]
        out[name] = Generator(name, models, default if default in models else order[0])
    return out


def generators_from_repository(repository: Path) -> dict[str, Generator]:
    """The generation model groups a model repository on disk declares."""
    return discover_generators(repository_configs(repository))


def single_generator(generators: Mapping[str, Generator], source: object) -> Generator:
    """The one generation group of ``generators`` (a repository serves one decoder spec), so
    that benches and load tests never restate its name; :class:`LookupError` naming what
    ``source`` holds otherwise."""
    if len(generators) != 1:
        raise LookupError(
            f"{source}: expected one generation model group, found {sorted(generators) or 'none'}"
            " (export one: `tritonforge export smollm2`)"
        )
    return next(iter(generators.values()))


def generator_from_repository(repository: Path) -> Generator:
    """The generation group a model repository on disk declares (:func:`single_generator`)."""
    return single_generator(generators_from_repository(repository), repository)
