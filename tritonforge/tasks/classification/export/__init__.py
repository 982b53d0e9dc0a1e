"""The classification task's share of the export: the postprocess model, the five public
outputs, label files and the labels parameter (:class:`export.task_share.TaskShare`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tritonforge.configschema import (
    DynamicBatching,
    EnsembleStep,
    InstanceGroup,
    QueueLimits,
    TritonConfig,
    params,
)
from tritonforge.errors import ModelConfigError
from tritonforge.export.errors import SpecError
from tritonforge.export.models.hf import CheckpointInfo
from tritonforge.export.pipeline_configs import marks
from tritonforge.export.pipeline_spec import PipelineSpec
from tritonforge.export.spec import BATCH_AXIS, QualityGate, TensorDecl
from tritonforge.export.task_share import TaskShare
from tritonforge.export.tritonconfig import LABEL_FILE
from tritonforge.modelconfig import ModelConfig, TensorSpec
from tritonforge.pipelines import LABELS_KEY
from tritonforge.tasks.classification.spec import Classification

LOGITS = "logits"  # the ensemble's tensor between the encoder and the postprocess


def head(spec: PipelineSpec) -> Classification:
    assert isinstance(spec.head, Classification)
    return spec.head


def outputs(classes: int, label_file: bool) -> tuple[TensorSpec, ...]:
    return (
        TensorSpec("label", "TYPE_STRING", (1,)),
        TensorSpec("score", "TYPE_FP32", (1,)),
        TensorSpec(
            "probabilities",
            "TYPE_FP32",
            (classes,),
            label_filename=LABEL_FILE if label_file else "",
        ),
        TensorSpec("top_labels", "TYPE_STRING", (-1,)),
        TensorSpec("top_scores", "TYPE_FP32", (-1,)),
    )


def postprocess_config(spec: PipelineSpec, encoder: ModelConfig) -> TritonConfig:
    section = head(spec)
    logits = encoder.outputs[0]
    classes = len(section.labels)
    if list(logits.dims) != [classes]:
        raise ModelConfigError(
            f"{encoder.name!r} output {logits.name!r} has dims {list(logits.dims)}, but the "
            f"pipeline has {classes} labels"
        )
    unqueued = QueueLimits(max_queue_size=0, queue_timeout_us=0)
    return TritonConfig(
        name=spec.names.postprocess(),
        backend="python",
        max_batch_size=spec.encoder.max_batch,
        inputs=(TensorSpec(LOGITS, logits.data_type, (classes,)),),
        outputs=outputs(classes, label_file=True),
        dynamic_batching=DynamicBatching.of(unqueued, spec.priority_levels),
        instance_groups=(InstanceGroup(section.instance_count),),
        parameters=params({**marks(spec, "postprocess"), "top_k": section.top_k}),
    )


class ClassificationShare(TaskShare):
    def validate(self, spec: PipelineSpec) -> list[str]:
        if not isinstance(spec.head, Classification):
            return ["a classification pipeline needs a `head` section (Classification)"]
        if len(spec.head.labels) < 2:
            return ["a classifier needs at least two labels"]
        return []

    def encoder_tensor(self, spec: PipelineSpec) -> str:
        return LOGITS

    def public_outputs(self, spec: PipelineSpec, encoder: ModelConfig) -> tuple[TensorSpec, ...]:
        return outputs(len(head(spec).labels), label_file=True)

    def public_params(self, spec: PipelineSpec) -> dict[str, object]:
        return {LABELS_KEY: json.dumps(list(head(spec).labels))}

    def bls_params(self, spec: PipelineSpec) -> dict[str, object]:
        return {"postprocess_model": spec.names.postprocess()}

    def steps_after_encoder(self, spec: PipelineSpec) -> tuple[EnsembleStep, ...]:
        names = tuple((o.name, o.name) for o in outputs(0, False))
        return (EnsembleStep(spec.names.postprocess(), ((LOGITS, LOGITS),), names),)

    def stage_models(self, spec: PipelineSpec) -> tuple[str, ...]:
        return (spec.names.postprocess(),)

    def stage_configs(
        self, spec: PipelineSpec, encoder: ModelConfig
    ) -> tuple[tuple[TritonConfig, str], ...]:
        return ((postprocess_config(spec, encoder), "postprocess"),)

    def files_beside(self, spec: PipelineSpec, model: str) -> dict[str, bytes]:
        labels = ("\n".join(head(spec).labels) + "\n").encode()
        return {f"{model}/{LABEL_FILE}": labels}

    def encoder_output(
        self, directory: Path, info: CheckpointInfo
    ) -> tuple[TensorDecl, QualityGate]:
        if not info.labels:
            raise SpecError(f"{directory}: config.json has no id2label; a classifier needs labels")
        output = TensorDecl(
            "logits", "float32", (BATCH_AXIS, len(info.labels)), atol=1e-4, rtol=1e-3
        )
        return output, QualityGate("logits", metric="top1")

    def pipeline_fields(self, info: CheckpointInfo, top_k: int) -> dict[str, Any]:
        return {
            "output_name": "probabilities",
            "head": Classification(info.labels, top_k=min(top_k, len(info.labels))),
        }


SHARE = ClassificationShare()
