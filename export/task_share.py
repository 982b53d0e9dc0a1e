"""A pipeline task's share of the export: the hooks :mod:`export.pipeline_configs`,
:class:`export.pipeline_spec.PipelineSpec` and :mod:`export.specs.from_pretrained` call.

Each pipeline task's ``export`` module (``tritonforge/tasks/<task>/export.py``) defines ``SHARE``,
a :class:`TaskShare`; the defaults here serve a task whose public output is the encoder's own
(renamed), with no stage after it. Shared code reaches it through :func:`share_of`, never by the
task's name.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tritonforge import tasks
from tritonforge.configschema import EnsembleStep, TritonConfig
from tritonforge.export.errors import SpecError
from tritonforge.modelconfig import ModelConfig, TensorSpec

if TYPE_CHECKING:
    from tritonforge.export.models.hf import CheckpointInfo
    from tritonforge.export.pipeline_spec import PipelineSpec
    from tritonforge.export.spec import QualityGate, TensorDecl


class TaskShare:
    """The default share: the encoder's first output is the public one (``spec.output_name``)."""

    def validate(self, spec: PipelineSpec) -> list[str]:
        """Problems of ``spec`` this task checks (its ``head`` section)."""
        return [] if spec.head is None else [f"a {spec.task} pipeline takes no `head` section"]

    def encoder_tensor(self, spec: PipelineSpec) -> str:
        """The ensemble's name of the encoder's output."""
        return spec.output_name

    def public_outputs(self, spec: PipelineSpec, encoder: ModelConfig) -> tuple[TensorSpec, ...]:
        out = encoder.outputs[0]
        return (TensorSpec(spec.output_name, out.data_type, out.dims),)

    def public_params(self, spec: PipelineSpec) -> dict[str, object]:
        """Extra ``tritonforge.*`` parameters of every public model."""
        return {}

    def bls_params(self, spec: PipelineSpec) -> dict[str, object]:
        """Extra parameters of the BLS model (e.g. the stage it calls after the encoder)."""
        return {}

    def steps_after_encoder(self, spec: PipelineSpec) -> tuple[EnsembleStep, ...]:
        return ()

    def stage_models(self, spec: PipelineSpec) -> tuple[str, ...]:
        """The models this task adds to the pipeline (after the encoders)."""
        return ()

    def stage_configs(
        self, spec: PipelineSpec, encoder: ModelConfig
    ) -> tuple[tuple[TritonConfig, str], ...]:
        """``(config, stage kind)`` of each model :meth:`stage_models` names."""
        return ()

    def files_beside(self, spec: PipelineSpec, model: str) -> dict[str, bytes]:
        """Repo-relative path -> content of files next to each of the pipeline's models but the
        tokenizer (e.g. label files)."""
        return {}

    def encoder_output(
        self, directory: Path, info: CheckpointInfo
    ) -> tuple[TensorDecl, QualityGate]:
        """``--from-pretrained``: the encoder's one output and its default int8 gate."""
        raise NotImplementedError

    def pipeline_fields(self, info: CheckpointInfo, top_k: int) -> dict[str, Any]:
        """``--from-pretrained``: this task's :class:`PipelineSpec` fields."""
        return {}


def share_of(task: str) -> TaskShare:
    """The export share of pipeline task ``task`` (its folder's ``export.SHARE``)."""
    try:
        declared = tasks.get(task)
    except tasks.UnknownTaskError as e:
        raise SpecError(str(e)) from e
    if declared.kind != tasks.PIPELINE:
        raise SpecError(
            f"task {task!r} is not a pipeline task: {list(tasks.names(tasks.PIPELINE))}"
        )
    share: TaskShare = declared.module("export").SHARE
    return share
