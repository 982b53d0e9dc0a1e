"""The embedding task's share of the export: the pooled encoder output is the public one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tritonforge.export.models.hf import CheckpointInfo
from tritonforge.export.spec import BATCH_AXIS, QualityGate, TensorDecl
from tritonforge.export.task_share import TaskShare

PUBLIC_OUTPUT = "embedding"


class EmbeddingShare(TaskShare):
    def encoder_output(
        self, directory: Path, info: CheckpointInfo
    ) -> tuple[TensorDecl, QualityGate]:
        output = TensorDecl(
            "sentence_embedding", "float32", (BATCH_AXIS, info.hidden_size), atol=1e-4, rtol=1e-3
        )
        return output, QualityGate("sentence_embedding", mean_cosine_min=0.99, min_cosine_min=0.97)

    def pipeline_fields(self, info: CheckpointInfo, top_k: int) -> dict[str, Any]:
        return {"output_name": PUBLIC_OUTPUT}


SHARE = EmbeddingShare()
