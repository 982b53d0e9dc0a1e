"""The house rules on the code's shape, held: no module over 500 lines and no function over 80
outside tests; no import cycle between the project's modules (lazy, in-function imports count; an
``if TYPE_CHECKING:`` import never runs and does not); docs/architecture.md names every package
and draws the front between the clients and Triton."""

from __future__ import annotations

import ast
import graphlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT
from tests.unit.test_layers import source_files

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
ARCHITECTURE = PROJECT_ROOT / "docs" / "architecture.md"


def size_findings(path: Path, source: str) -> list[str]:
    """What in ``source`` breaks the size rule, one line per module or function."""
    rel = path.relative_to(PROJECT_ROOT) if path.is_absolute() else path
    out = []
    lines = len(source.splitlines())
    if lines > MAX_MODULE_LINES:
        out.append(f"{rel}: {lines} lines (at most {MAX_MODULE_LINES})")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                out.append(f"{rel}:{node.lineno}: {node.name} has {length} lines")
    return out


def test_no_module_over_500_lines_and_no_function_over_80() -> None:
    found = [f for path in source_files() for f in size_findings(path, path.read_text())]
    assert not found, "split them (house rules):\n" + "\n".join(found)


def test_the_size_check_sees_a_long_function_and_a_long_module() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert size_findings(Path("m.py"), f"def f():\n{body}\n") == ["m.py:1: f has 81 lines"]
    long = "\n".join(f"x{i} = {i}" for i in range(MAX_MODULE_LINES + 1))
    assert size_findings(Path("m.py"), long) == ["m.py: 501 lines (at most 500)"]


def module_name(path: Path) -> str:
    rel = path.relative_to(PROJECT_ROOT).with_suffix("").parts
    parts = rel[1:] if rel[0] == "tritonforge" else rel
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(("tritonforge", *parts))


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:``."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def imports_of(module: str, tree: ast.AST, modules: set[str]) -> set[str]:
    """The project modules ``module`` imports, module-level or in a function."""
    out = set()
    package = module if module in _packages(modules) else module.rpartition(".")[0]
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}".rstrip(".")
            out |= {
                f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names
            }
    return {m for m in out if m in modules and m != module}


def _packages(modules: set[str]) -> set[str]:
    return {m.rpartition(".")[0] for m in modules}


def import_graph(files: dict[str, str]) -> dict[str, set[str]]:
    """Module name -> the project modules it imports, from module name -> source."""
    modules = set(files)
    return {m: imports_of(m, ast.parse(src), modules) for m, src in files.items()}


def first_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        cycle: list[str] = e.args[1]
        return cycle
    return None


def test_the_import_graph_has_no_cycle_lazy_imports_included() -> None:
    files = {module_name(p): p.read_text() for p in source_files()}
    cycle = first_cycle(import_graph(files))
    assert cycle is None, "import cycle (a lazy import is still a tie): " + " -> ".join(cycle)


def test_the_cycle_check_sees_a_lazy_cycle_and_ignores_type_checking() -> None:
    files = {
        "tritonforge.a": "def f():\n    from tritonforge.b import g\n",
        "tritonforge.b": "from tritonforge import a\n",
    }
    assert set(first_cycle(import_graph(files)) or ()) == {"tritonforge.a", "tritonforge.b"}
    files["tritonforge.a"] = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import tritonforge.b\n"
    )
    assert first_cycle(import_graph(files)) is None


def packages() -> list[str]:
    """Every package under tritonforge/ (the linked top-level folders included), as a path."""
    root = PROJECT_ROOT / "tritonforge"
    found = {
        init.parent.relative_to(root).as_posix()
        for init in root.rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    return sorted(p for p in found if p != ".")


@pytest.mark.parametrize("package", packages())
def test_the_architecture_names_every_package(package: str) -> None:
    """A task's folders are named by the convention (``tasks/<task>/``, its modules by layer)."""
    text = ARCHITECTURE.read_text()
    parts = package.split("/")
    name = "tasks/<task>/" if parts[0] == "tasks" and len(parts) > 1 else f"{package}/"
    assert name in text, f"docs/architecture.md does not name {name}"


def test_the_architecture_draws_the_front_before_triton() -> None:
    text = ARCHITECTURE.read_text()
    drawing = re.search(r"request path\n.*?```", text, re.S)
    assert drawing, "docs/architecture.md: no request path drawing"
    lines = drawing.group(0).splitlines()

    def first(*words: str) -> int:
        return next((i for i, line in enumerate(lines) if all(w in line for w in words)), -1)

    client, front, triton = first("client/"), first("front", ":8000"), first("tritonserver")
    assert -1 < client < front < triton, "clients talk to the front (public ports), Triton behind"
