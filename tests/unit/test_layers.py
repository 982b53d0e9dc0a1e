"""The layers of docs/architecture.md, enforced: which folder may import which.

Every import counts, module-level or inside a function: a lazy import is still a tie. The console
entry (``tritonforge/cli.py``) sits above every package: it reaches the subcommands by module
*name* (importlib), so the core's own modules never import the packages built on them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT

PACKAGES = ("client", "deploy", "export", "loadtest", "runtime")
ALLOWED: dict[str, set[str]] = {
    # the shared core: imported by every model, backend and package; depends on none of them
    "core": set(),
    # the Python models copied into the model repository
    "stages": {"core"},
    # export reads the stages' sources to copy them into the repository it writes
    "export": {"core", "stages"},
    "client": {"core"},
    # the demo and the front's bench are consumers of the client; serve reads the export
    # registry (export.specs, light: no torch) to run the default exports in the background
    "runtime": {"core", "client", "export"},
    # load tests start servers, export anchors and drive the client
    "loadtest": {"core", "client", "runtime", "export"},
    # offline checks of what export writes and runtime runs
    "deploy": {"core", "export", "runtime"},
}


# A task folder (tritonforge/tasks/<task>/) holds a task's share of every layer; each of its modules
# (or subpackages) is named by the layer it belongs to, and anything else in it is core.
TASK_MODULE_LAYERS: dict[str, str] = {
    "stages": "stages",
    "export": "export",
    "client": "client",
    "routes": "runtime",
    "loadtest": "loadtest",
}


def _layer(parts: tuple[str, ...]) -> str:
    """The layer of a module given as its dotted parts below ``tritonforge``."""
    if parts and parts[0] in PACKAGES:
        return parts[0]
    if parts[:1] == ("tasks",) and len(parts) > 2:
        return TASK_MODULE_LAYERS.get(parts[2].removesuffix(".py"), "core")
    return "stages" if parts[:1] == ("stages",) else "core"


def layer_of(path: Path) -> str:
    rel = path.relative_to(PROJECT_ROOT).parts
    if rel[0] in PACKAGES:
        return rel[0]
    return _layer(rel[1:]) if rel[0] == "tritonforge" else "core"


def layer_of_module(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "tritonforge":
        return None
    return _layer(tuple(parts[1:]))


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
    return out


def source_files() -> list[Path]:
    roots = [PROJECT_ROOT / "tritonforge", *(PROJECT_ROOT / p for p in PACKAGES)]
    files = []
    for root in roots:
        for path in root.rglob("*.py"):
            rel = path.relative_to(PROJECT_ROOT).parts
            # tritonforge/client etc. are links to the top-level folders: read those once
            if rel[0] == "tritonforge" and len(rel) > 1 and rel[1] in PACKAGES:
                continue
            files.append(path)
    return files


def violations() -> list[str]:
    out = []
    for path in source_files():
        src = layer_of(path)
        for line, module in imported_modules(ast.parse(path.read_text())):
            dst = layer_of_module(module)
            if dst is None or dst == src or dst in ALLOWED[src]:
                continue
            out.append(f"{path.relative_to(PROJECT_ROOT)}:{line}: {src} imports {module} ({dst})")
    return out


def test_every_folder_imports_only_the_layers_below_it() -> None:
    found = violations()
    assert not found, "see docs/architecture.md (Layers):\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("module", "layer"),
    [
        ("tritonforge.errors", "core"),
        ("tritonforge.stages.bls_model", "stages"),
        ("tritonforge.runtime.front.app", "runtime"),
        ("tritonforge.tasks", "core"),
        ("tritonforge.tasks.rerank", "core"),
        ("tritonforge.tasks.rerank.protocol", "core"),
        ("tritonforge.tasks.rerank.stages.tokenizer_model", "stages"),
        ("tritonforge.tasks.rerank.export", "export"),
        ("tritonforge.tasks.rerank.client", "client"),
        ("tritonforge.tasks.rerank.routes", "runtime"),
        ("tritonforge.tasks.rerank.loadtest", "loadtest"),
        ("numpy", None),
    ],
)
def test_modules_map_to_their_layer(module: str, layer: str | None) -> None:
    assert layer_of_module(module) == layer


def test_task_folder_files_map_to_their_layer() -> None:
    task = PROJECT_ROOT / "tritonforge" / "tasks" / "rerank"
    assert layer_of(task / "export.py") == "export"
    assert layer_of(task / "stages" / "tokenizer_model.py") == "stages"
    assert layer_of(task / "protocol.py") == "core"


def test_a_wrong_way_tie_is_found() -> None:
    tree = ast.parse("def f():\n    from tritonforge.runtime.front.app import Front\n")
    ((_line, module),) = imported_modules(tree)
    assert layer_of_module(module) not in ALLOWED["client"]
