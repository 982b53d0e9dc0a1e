"""A pipeline spec: the single source of truth for one served pipeline.

One :class:`PipelineSpec` declares a pipeline's name, task, model (its :class:`ExportSpec`),
tokenizer, variants and every stage's knobs. ``make export`` builds the encoders from it and then
generates every ``config.pbtxt`` of the pipeline (tokenizer, encoders, postprocess, ensembles,
BLS: :mod:`export.pipeline_configs`); the public models' configs carry ``tritonforge.*``
parameters from which clients, load tests and probes discover the pipeline
(:mod:`tritonforge.pipelines`). Several pipelines live side by side, each under its own names.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tritonforge import tasks
from tritonforge.configschema import QueueLimits
from tritonforge.export.errors import SpecError
from tritonforge.export.spec import ExportSpec
from tritonforge.pipelines import VARIANTS, StageNames

FUSED = ("fp32", "int8")
"""The variants served by ONNX Runtime (a fused model runs their graph); torchscript is not."""


@dataclass(frozen=True)
class TokenizerStage(QueueLimits):
    """The tokenizer model (Python backend): batching, padding bucket, overload policy."""

    pad_to_multiple_of: int = 16
    instance_count: int = 1
    max_queue_size: int = field(default=128, kw_only=True)


@dataclass(frozen=True)
class Degrade:
    """Answer from a cheaper variant instead of refusing when the default one is overloaded.

    A BLS instance counts itself overloaded when it picks up more than ``max_queued`` waiting
    requests at once, or when the oldest of them waited an estimated ``max_queue_delay_ms`` or
    more (docs/reliability.md); the fp32 encoder refusing a call (queue full or queue timeout)
    also degrades. ``enabled=False`` (the default) degrades only requests that ask for it (request
    parameter ``fallback`` / header ``X-Fallback``); a request can always forbid it.
    """

    enabled: bool = False
    to: str = "int8"
    max_queued: int = 4
    max_queue_delay_ms: int = 250


@dataclass(frozen=True)
class BlsStage(QueueLimits):
    """The BLS orchestrator (Python backend): tokenizes itself, one encoder call per shape."""

    instance_count: int = 2
    max_queue_size: int = field(default=32, kw_only=True)
    stage_timeout_ms: int = 30_000
    default_variant: str = "fp32"
    degrade: Degrade = field(default_factory=Degrade)


@dataclass(frozen=True)
class Limits:
    """Caller-facing limits of every public model: texts per request and bytes per text."""

    max_items: int = 64
    max_text_bytes: int = 16384


@dataclass(frozen=True)
class ModelVersion:
    """One version of a pipeline's model: its own export spec (e.g. another checkpoint)."""

    number: int
    encoder: ExportSpec
    note: str = ""


@dataclass(frozen=True)
class Canary:
    """How the BLS splits unpinned requests between versions: percent per version number,
    chosen by a hash of the request id (or of its texts), so a client can reproduce the split."""

    weights: tuple[tuple[int, int], ...]  # (version, percent), percents sum to 100


@dataclass(frozen=True)
class PipelineSpec:
    """Everything that defines a served pipeline.

    ``name`` is the public name (the fp32 ensemble's); ``stage_prefix`` prefixes the internal
    stages (default ``"<name>_"``). ``encoder`` is the model's export spec; its serving names are
    filled in from :attr:`names` (a spec never spells a model name twice).
    """

    name: str
    task: str
    encoder: ExportSpec
    tokenizer_file: Path
    description: str = ""
    stage_prefix: str | None = None
    variants: tuple[str, ...] = VARIANTS
    input_name: str = "text"
    output_name: str = ""  # the public output (the encoder's, renamed; the task's share says)
    tokenizer: TokenizerStage = field(default_factory=TokenizerStage)
    bls: BlsStage | None = field(default_factory=BlsStage)
    limits: Limits = field(default_factory=Limits)
    # the task's own section (its folder's spec type, e.g. tasks.classification.spec.Classification)
    head: Any = None
    # Further versions of the model (version 1 is ``encoder``); all are served side by side.
    extra_versions: tuple[ModelVersion, ...] = ()
    canary: Canary | None = None
    # Triton's response cache on the encoders (the server gives its size). Not on the ensembles:
    # their cache key holds the ensemble's version, not the encoder's, so a new encoder version
    # would be answered from the old one's entries.
    response_cache: bool = False
    # The ensembles of the variants ONNX Runtime serves (fp32, int8) run one fused model
    # (tokenizer + encoder graph + the task's postprocess, ``<prefix>fused_<variant>``) instead of
    # one step per stage: one stub hop and the tensor hand-offs fewer (docs/performance.md, "The
    # fused first step"). With ``response_cache`` the fused model caches instead of the encoder.
    fused: bool = True
    # Triton priority levels on the queues (tokenizer, encoders, postprocess, BLS): level 1 is
    # served first, requests without a priority get the last level (bulk). 0 = no priorities.
    priority_levels: int = 2

    def __post_init__(self) -> None:
        problems = []
        if self.task not in tasks.names(tasks.PIPELINE):
            problems.append(f"task {self.task!r} is not one of {list(tasks.names(tasks.PIPELINE))}")
        else:
            from tritonforge.export.task_share import share_of

            problems += share_of(self.task).validate(self)  # e.g. a classifier's labels
        unknown = sorted(set(self.variants) - set(VARIANTS))
        if unknown or "fp32" not in self.variants:
            problems.append(f"variants {list(self.variants)} must include fp32, from {VARIANTS}")
        if self.bls is not None and self.bls.default_variant not in self.variants:
            problems.append(f"bls.default_variant {self.bls.default_variant!r} is not a variant")
        if self.bls is not None:
            degrade = self.bls.degrade
            if degrade.to == self.bls.default_variant or (
                degrade.enabled and degrade.to not in self.variants
            ):
                problems.append(
                    f"bls.degrade.to {degrade.to!r} must be a variant of {list(self.variants)} "
                    f"other than the default {self.bls.default_variant!r}"
                )
            if degrade.max_queued < 1 or degrade.max_queue_delay_ms < 1:
                problems.append("bls.degrade.max_queued and max_queue_delay_ms must be >= 1")
        if self.priority_levels < 0:
            problems.append(f"priority_levels {self.priority_levels} must be >= 0")
        if self.limits.max_items > self.encoder.max_batch:
            problems.append(
                f"limits.max_items {self.limits.max_items} > the encoder's max_batch "
                f"{self.encoder.max_batch}"
            )
        if self.encoder.max_length % self.tokenizer.pad_to_multiple_of:
            problems.append(
                f"tokenizer.pad_to_multiple_of {self.tokenizer.pad_to_multiple_of} must divide "
                f"max_length {self.encoder.max_length}"
            )
        numbers = [1, *(v.number for v in self.extra_versions)]
        if len(set(numbers)) != len(numbers) or min(numbers) < 1:
            problems.append(f"version numbers {numbers} must be distinct and >= 1")
        if self.canary is not None:
            split = dict(self.canary.weights)
            if sum(split.values()) != 100 or set(split) - set(numbers) or min(split.values()) < 0:
                problems.append(
                    f"canary weights {split} must be percents of versions {numbers} summing to 100"
                )
        if problems:
            raise SpecError(f"pipeline spec {self.name!r}: " + "; ".join(problems))
        if self.encoder.serving is None:
            raise SpecError(f"pipeline spec {self.name!r}: the encoder spec has no serving section")
        object.__setattr__(self, "encoder", self._named(self.encoder, numbers))
        object.__setattr__(
            self,
            "extra_versions",
            tuple(
                dataclasses.replace(v, encoder=self._named(v.encoder, numbers))
                for v in self.extra_versions
            ),
        )

    def _named(self, encoder: ExportSpec, versions: list[int]) -> ExportSpec:
        """``encoder`` with this pipeline's stage names and served versions filled in."""
        names = self.names
        base = encoder.serving or self.encoder.serving
        assert base is not None
        serving = dataclasses.replace(
            base,
            pipeline=self.name,
            task=self.task,
            fp32_name=names.encoder("fp32"),
            int8_name=names.encoder("int8") if "int8" in self.variants else None,
            torchscript_name=(
                names.encoder("torchscript") if "torchscript" in self.variants else None
            ),
            versions=tuple(sorted(versions)),
            response_cache=self.response_cache,
            priority_levels=self.priority_levels,
        )
        return dataclasses.replace(encoder, serving=serving)

    @property
    def versions(self) -> tuple[ModelVersion, ...]:
        """Every version, version 1 (``encoder``) first."""
        return (ModelVersion(1, self.encoder), *self.extra_versions)

    def fused_variants(self, variants: tuple[str, ...] | None = None) -> tuple[str, ...]:
        """The variants (of ``variants``, default all) whose ensemble runs a fused model."""
        if not self.fused:
            return ()
        return tuple(v for v in (self.variants if variants is None else variants) if v in FUSED)

    @property
    def names(self) -> StageNames:
        prefix = f"{self.name}_" if self.stage_prefix is None else self.stage_prefix
        return StageNames(self.name, prefix)

    @property
    def encoder_output(self) -> str:
        """The encoder graph's one output (embedding or logits)."""
        return self.encoder.outputs[0].name

    def model_names(self, variants: tuple[str, ...] | None = None) -> list[str]:
        """Every model this pipeline puts in the repository (for ``variants``, default all)."""
        names = self.names
        chosen = self.variants if variants is None else variants
        out = [names.tokenizer(), *(names.encoder(v) for v in chosen)]
        if self.task in tasks.names(tasks.PIPELINE):
            from tritonforge.export.task_share import share_of

            out += share_of(self.task).stage_models(self)
        out += [names.fused(v) for v in self.fused_variants(chosen)]
        out += [names.ensemble(v) for v in chosen]
        if self.bls is not None:
            out.append(names.bls())
        return out
