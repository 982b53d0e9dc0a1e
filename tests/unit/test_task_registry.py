"""The task registry (tritonforge/tasks): every task lives in its folder, and the shared machinery
branches on no task by name (docs/architecture.md, "Adding a task").

Outside the registry and the task folders, no source spells a registered task's name as a
string, compares anything with a task package's ``NAME``, or tests a task's spec section for
None; a shared module reaches a task's pieces through :func:`tritonforge.tasks.get`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT
from tests.unit.test_layers import source_files
from tritonforge import tasks
from tritonforge.errors import ModelConfigError

TASK_FOLDERS = ("tritonforge/tasks/",)
# OpenAI's wire format names a field "embedding" (an object type and a key), not our task.
WIRE_FORMAT = {
    "runtime/front/openai/responses.py": 2,
    "loadtest/anchors/infinity.py": 1,
    # Docker Compose's and Kubernetes' container "image" key, not the image task
    "deploy/validate/compose.py": 2,
    "deploy/validate/k8s.py": 2,
}
# Shared modules that still import a task package by name, and why (the rest reach tasks through
# the registry). Shrink this list; never grow it.
NAMED_TASK_IMPORTS = {
    "export/specs/__init__.py": "the spec registry: each model names its task",
    "export/specs/minilm.py": "a model spec names its task",
    "export/specs/sentiment.py": "a model spec names its task",
    "export/specs/smollm2.py": "a model spec names its task",
}


def _shared_files() -> list[tuple[str, ast.Module]]:
    out = []
    for path in source_files():
        rel = path.relative_to(PROJECT_ROOT).as_posix()
        if not rel.startswith(TASK_FOLDERS):
            out.append((rel, ast.parse(path.read_text())))
    return out


def _docstrings(tree: ast.Module) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
        ):
            found.add(id(body[0].value))
    return found


def task_name_literals(tree: ast.Module, names: tuple[str, ...]) -> list[int]:
    """Lines of ``tree`` spelling one of ``names`` as a string (docstrings aside)."""
    docs = _docstrings(tree)
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in names and id(node) not in docs
    ]


def _task_aliases(tree: ast.Module) -> set[str]:
    """Local names bound to a task package (``from tritonforge.tasks import embedding``)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "tritonforge.tasks":
            out |= {a.asname or a.name for a in node.names if a.name in tasks.registry()}
    return out


def task_branches(tree: ast.Module, names: tuple[str, ...]) -> list[int]:
    """Lines comparing with a task package's ``NAME`` or testing a task's section for None
    (``spec.classification is None``)."""
    aliases = _task_aliases(tree)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for op in operands:
            if (
                isinstance(op, ast.Attribute)
                and op.attr == "NAME"
                and isinstance(op.value, ast.Name)
                and op.value.id in aliases
            ):
                out.append(node.lineno)
            if (
                isinstance(op, ast.Attribute)
                and op.attr in names
                and any(isinstance(o, ast.Constant) and o.value is None for o in operands)
            ):
                out.append(node.lineno)
    return out


def named_task_imports(tree: ast.Module) -> list[int]:
    """Lines importing a task package by name (``tritonforge.tasks.<task>``)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("tritonforge.tasks.") or (
                node.module == "tritonforge.tasks"
                and any(a.name in tasks.registry() for a in node.names)
            ):
                out.append(node.lineno)
        elif isinstance(node, ast.Import):
            out += [node.lineno for a in node.names if a.name.startswith("tritonforge.tasks.")]
    return out


def test_no_task_name_is_spelled_outside_the_task_folders() -> None:
    names = tasks.names()
    found = []
    for rel, tree in _shared_files():
        lines = task_name_literals(tree, names)
        if len(lines) > WIRE_FORMAT.get(rel, 0):
            found.append(f"{rel}:{lines}")
    assert not found, "use the registry (tritonforge.tasks) instead:\n" + "\n".join(found)


def test_no_shared_module_branches_on_a_task() -> None:
    names = tasks.names()
    found = [
        f"{rel}:{lines}" for rel, tree in _shared_files() if (lines := task_branches(tree, names))
    ]
    assert not found, "declare it on the Task instead:\n" + "\n".join(found)


def test_only_the_listed_shared_modules_import_a_task_by_name() -> None:
    importing = {rel for rel, tree in _shared_files() if named_task_imports(tree)}
    assert importing <= set(NAMED_TASK_IMPORTS), sorted(importing - set(NAMED_TASK_IMPORTS))
    stale = set(NAMED_TASK_IMPORTS) - importing
    assert not stale, f"no longer imports a task: drop {sorted(stale)} from the list"


@pytest.mark.parametrize(
    ("source", "literals", "branches"),
    [
        ('if spec.task == "classification":\n    pass\n', 1, 0),
        ("from tritonforge.tasks import embedding\nok = task != embedding.NAME\n", 0, 1),
        ("ok = spec.classification is not None\n", 0, 1),
        ('"""A docstring may say embedding."""\nx = tasks.get(t).labels\n', 0, 0),
    ],
)
def test_the_checks_find_a_branch(source: str, literals: int, branches: int) -> None:
    tree = ast.parse(source)
    assert len(task_name_literals(tree, tasks.names())) == literals
    assert len(task_branches(tree, tasks.names())) == branches


def test_every_registered_task_is_a_folder_with_its_layers() -> None:
    for task in tasks.registry().values():
        assert task.folder == PROJECT_ROOT / "tritonforge" / "tasks" / task.name
        for kind in task.stages:
            assert task.stage_source(kind).is_file()
        if task.kind == tasks.PIPELINE:
            for layer in ("export", "client", "loadtest"):
                module = task.folder / f"{layer}.py"
                package = task.folder / layer / "__init__.py"
                assert module.is_file() or package.is_file(), (task.name, layer)
            # the Locust users and the bench cell live in the folder, found through the registry
            loadtest = task.module("loadtest")
            assert loadtest.LOCUSTFILE.is_relative_to(task.folder), task.name
            assert loadtest.LOCUSTFILE.is_file() and loadtest.USERS["both"], task.name
            if hasattr(loadtest, "BENCH"):
                assert (task.folder / "loadtest" / f"{loadtest.BENCH}.py").is_file(), task.name
            if task.client_call:
                from tritonforge.client.core import install_task_methods
                from tritonforge.client.sync import EmbeddingClient

                install_task_methods()  # the first client made runs it
                assert callable(getattr(EmbeddingClient, task.client_call))
        for source in task.export_sources:
            assert (PROJECT_ROOT / "tritonforge" / source).exists(), source


def test_an_unknown_task_is_refused_naming_the_registered_ones() -> None:
    with pytest.raises(ModelConfigError, match=r"registered: .*embedding"):
        tasks.get("rerankk")


def test_a_pipeline_without_a_task_mark_gets_the_default_task() -> None:
    assert tasks.default().kind == tasks.PIPELINE
    assert tasks.default().name == tasks.names(tasks.PIPELINE)[0]


def test_the_shared_exporter_digest_leaves_out_the_tasks_own_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tritonforge.export import staging

    before = staging.code_digest()
    decoder_only = PROJECT_ROOT / "export" / "specs" / "smollm2.py"
    assert staging._own_digest("export/specs/smollm2.py") and decoder_only.is_file()
    assert not staging._own_digest("export/specs/minilm.py")
    monkeypatch.setattr(tasks, "export_sources", lambda: ())
    assert staging.code_digest() != before  # counted once a task no longer declares it


def test_each_task_client_method_is_blocking_and_async_on_the_shells() -> None:
    import inspect

    from tritonforge.client.aio import AsyncEmbeddingClient
    from tritonforge.client.core import install_task_methods
    from tritonforge.client.sync import EmbeddingClient

    install_task_methods()
    found = set()
    for task in tasks.registry().values():
        if (task.folder / "client.py").is_file():
            for name in getattr(task.module("client"), "METHODS", {}):
                assert not inspect.iscoroutinefunction(getattr(EmbeddingClient, name)), name
                assert inspect.iscoroutinefunction(getattr(AsyncEmbeddingClient, name)), name
                found.add(name)
    assert {"embed", "classify", "rerank"} <= found


def test_the_client_package_exports_the_tasks_result_types() -> None:
    import tritonforge.client as client_package
    from tritonforge.tasks.classification.client import Classification

    assert client_package.Classification is Classification
    with pytest.raises(AttributeError, match="NoSuchType"):
        _ = client_package.NoSuchType
