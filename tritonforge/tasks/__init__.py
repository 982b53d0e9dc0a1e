"""The task registry: what each task (embedding, classification, generation, ...) declares.

A task is a folder, ``tritonforge/tasks/<task>/``, holding everything specific to it (spec types,
its share of config generation, its Triton stages, client calls, canary, Locust task, bench cell,
HTTP routes); each module there is named by its layer (``stages``, ``export``, ``client``,
``routes``, ``loadtest``; the rest is core, docs/architecture.md "Layers"). Its ``__init__``
defines ``TASK``, a :class:`Task`: the facts the shared machinery reads instead of branching on a
task's name. Shared code reaches a task's layer modules by name (:meth:`Task.module`), so this
module stays light (standard library only: Triton's Python stub imports it too).

Plugging a task in = its folder + one line in :data:`REGISTERED` (docs/architecture.md, "Adding
a task").
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType

from tritonforge.errors import ModelConfigError

# The registered tasks' packages, in order (the order the demo shows them and the default one).
REGISTERED: tuple[str, ...] = (
    "tritonforge.tasks.embedding",
    "tritonforge.tasks.classification",
    "tritonforge.tasks.generation",
    "tritonforge.tasks.rerank",
    "tritonforge.tasks.image",
)

# How a task is served: a ``pipeline`` is text -> tokenizer -> encoder (-> its postprocess) behind
# one ensemble per variant and a BLS model; a ``generator`` is one decoupled model per variant.
PIPELINE, GENERATOR = "pipeline", "generator"
# What an exported Hugging Face encoder returns (export.models.hf): the attention-masked mean of
# the last hidden state, or the sequence-classification head's logits.
POOLED, LOGITS = "pooled", "logits"


class UnknownTaskError(ModelConfigError):
    """A spec or a config names a task that is not registered."""


@dataclass(frozen=True)
class Task:
    """One task's declaration (its folder's ``TASK``)."""

    name: str
    package: str  # the folder's package (``__name__`` of its ``__init__``)
    kind: str = PIPELINE
    summary_output: str | None = None
    """Pipelines: the public output whose last dim is ``Pipeline.dim`` (None: the first)."""
    labels: bool = False
    """The encoder's output names classes: label files, ``tritonforge.labels``."""
    encoder_output: str = POOLED
    """What ``--from-pretrained`` exports (:data:`POOLED` or :data:`LOGITS`)."""
    stages: Mapping[str, str] = field(default_factory=dict)
    """Stage kind -> its Triton Python model's source, under the folder's ``stages/``."""
    export_sources: tuple[str, ...] = ()
    """Sources (relative to the ``tritonforge`` namespace) that fingerprint this task's export by
    their own digest; the shared exporter's digest leaves them out."""
    client_call: str = ""
    """The client method that answers a pipeline of this task (``embed``, ``classify``)."""
    openai_embeddings: bool = False
    """Its ensembles are ``/v1/embeddings`` models (runtime.front.openai.catalog)."""

    def module(self, layer: str) -> ModuleType:
        """The folder's module ``layer`` (``export``, ``client``, ``loadtest``, ...)."""
        return importlib.import_module(f"{self.package}.{layer}")

    @property
    def folder(self) -> Path:
        spec = importlib.util.find_spec(self.package)
        assert spec is not None and spec.origin is not None
        return Path(spec.origin).parent

    def stage_source(self, kind: str) -> Path:
        return self.folder / "stages" / self.stages[kind]


@cache
def registry() -> dict[str, Task]:
    """Every registered task, by name, in :data:`REGISTERED` order."""
    out: dict[str, Task] = {}
    for package in REGISTERED:
        task = importlib.import_module(package).TASK
        out[task.name] = task
    return out


def get(name: str) -> Task:
    """The task ``name``; :class:`UnknownTaskError` naming the registered ones."""
    try:
        return registry()[name]
    except KeyError as e:
        raise UnknownTaskError(f"unknown task {name!r}; registered: {sorted(registry())}") from e


def names(kind: str | None = None) -> tuple[str, ...]:
    """The registered tasks' names (of ``kind`` when given), in registry order."""
    return tuple(n for n, t in registry().items() if kind is None or t.kind == kind)


def default(kind: str = PIPELINE) -> Task:
    """The first registered task of ``kind`` (a pipeline config without a task mark has it)."""
    return registry()[names(kind)[0]]


def stage_source(kind: str) -> Path | None:
    """The source of stage ``kind`` a task declares (None: no task declares it)."""
    for task in registry().values():
        if kind in task.stages:
            return task.stage_source(kind)
    return None


def export_sources() -> tuple[str, ...]:
    """Every task's own-digest export sources (the shared exporter's digest skips them)."""
    return tuple(s for t in registry().values() for s in t.export_sources)
