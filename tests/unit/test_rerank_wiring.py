"""Reranking's registration: the task, its default export, its routes and the export CLI's
``--from-onnx`` checks (the served behaviour is in tests/integration/test_rerank*.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tritonforge import tasks
from tritonforge.export import cli as export_cli
from tritonforge.export.specs import default_exports, get_entry
from tritonforge.runtime.front.openai.catalog import catalog, task_handlers
from tritonforge.tasks.rerank.spec import MS_MARCO_MINILM


def test_rerank_is_registered_as_a_task_of_its_own_kind() -> None:
    task = tasks.get("rerank")
    assert task.kind not in (tasks.PIPELINE, tasks.GENERATOR)
    assert all(task.stage_source(kind).is_file() for kind in task.stages)
    assert get_entry("msmarco").task == "rerank"
    assert ("msmarco",) in default_exports()


def test_the_front_routes_cohere_and_jina_paths() -> None:
    assert {"/v1/rerank", "/v2/rerank", "/rerank"} <= set(task_handlers())


def test_the_catalog_lists_a_rerank_ensemble_with_its_task() -> None:
    marks = {"tritonforge.task": {"string_value": "rerank"}}
    configs = [
        {
            "name": "rerank",
            "parameters": {**marks, "tritonforge.role": {"string_value": "ensemble"}},
            "ensemble_scheduling": {"step": [{"model_name": "rerank_tokenizer"}]},
        },
        {
            "name": "rerank_tokenizer",
            "parameters": {**marks, "max_documents": {"string_value": "7"}},
        },
    ]
    model = catalog(configs)[MS_MARCO_MINILM.ensemble]
    assert (model.kind, model.tokenizer_model, model.param_int("max_documents")) == (
        "rerank",
        "rerank_tokenizer",
        7,
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["--from-onnx", "DIR"],  # no --task
        ["--from-onnx", "DIR", "--task", "embedding"],  # a text pipeline: --from-pretrained
        ["msmarco", "--from-onnx", "DIR", "--task", "rerank"],  # two sources
    ],
)
def test_export_cli_refuses_a_bad_from_onnx(argv: list[str], tmp_path: Path) -> None:
    argv = [a.replace("DIR", str(tmp_path)) for a in argv]
    with pytest.raises(SystemExit) as exited:
        export_cli.parse_args(argv)
    assert exited.value.code == 2
