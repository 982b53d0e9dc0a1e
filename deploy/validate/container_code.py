"""What runs inside the images: Python 3.10 syntax and only the imports the image installs, for
the models' ``model.py``, the shared package, the front and the Locust image's code."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tritonforge import tasks
from tritonforge.deploy.validate.images import pins
from tritonforge.deploy.validate.paths import MODEL_REPOSITORY, PROJECT_ROOT, TRITON_REQUIREMENTS

# The Triton container's interpreter (Ubuntu 22.04 in the 24.xx releases).
CONTAINER_PYTHON = (3, 10)
# stdlib names new in 3.11 (module or attribute) that would break on the container's 3.10.
PY311_ONLY = {"tomllib", "StrEnum", "TaskGroup", "ExceptionGroup", "Self", "LiteralString",
              "Never", "assert_never", "reveal_type", "UTC"}  # fmt: skip
# Import names of the image's pins that differ from the package name.
IMPORT_NAMES = frozenset({"grpc", "google", "attr", "rapidjson"})


def module_imports(tree: ast.AST, top_level_only: bool) -> Iterator[str]:
    nodes = tree.body if top_level_only and isinstance(tree, ast.Module) else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names)


@dataclass(frozen=True)
class ContainerCode:
    """Python files the container runs: the models' ``model.py`` and the shared package."""

    model_files: tuple[Path, ...]
    package_files: tuple[Path, ...]

    @classmethod
    def find(cls, repo: Path = MODEL_REPOSITORY, root: Path = PROJECT_ROOT) -> ContainerCode:
        return cls(
            model_files=tuple(sorted(repo.glob("*/[0-9]*/model.py"))),
            package_files=tuple(sorted((root / "tritonforge").glob("*.py"))),
        )


# `python3 -m tritonforge.runtime front` in the Triton image (docker-compose.yml, deploy/k8s).
FRONT_ENTRY = PROJECT_ROOT / "runtime" / "__main__.py"
FRONT_FIRST_PARTY = frozenset({"runtime", "tritonforge"})
# Import roots the Locust image provides beyond its pins: the project's code and the pins' deps.
LOADTEST_IMPORTS = frozenset({"client", "loadtest", "tritonforge", "grpc", "gevent"})


def module_file(module: str, root: Path) -> list[Path]:
    """Files Python executes to import a first-party ``module`` (package ``__init__``s included)."""
    parts = module.split(".")
    files = [root.joinpath(*parts[:i], "__init__.py") for i in range(1, len(parts) + 1)]
    files.append(root.joinpath(*parts[:-1], parts[-1] + ".py"))
    return [f for f in files if f.exists()]


def default_locustfile() -> Path:
    """The locustfile the Locust image runs (docker-compose.yml): the default task's, in its
    folder's ``loadtest``."""
    return tasks.default().folder / "loadtest" / "locustfile.py"


def loadtest_code(
    entry: Path | None = None,
    root: Path = PROJECT_ROOT,
    first_party: frozenset[str] = frozenset({"client", "loadtest", "tritonforge"}),
) -> ContainerCode:
    """What an image runs from ``entry`` (by default the Locust image's locustfile): the entry and
    the first-party modules it imports at top level, transitively."""
    seen: list[Path] = []
    todo = [entry or default_locustfile()]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.append(path)
        tree = ast.parse(path.read_text(), filename=str(path))
        for name in module_imports(tree, top_level_only=True):
            if name.split(".")[0] in first_party:
                todo += module_file(name, root)
    return ContainerCode(model_files=(), package_files=tuple(sorted(seen)))


def container_code_findings(
    code: ContainerCode,
    requirements: Path = TRITON_REQUIREMENTS,
    extra_allowed: frozenset[str] = frozenset({"triton_python_backend_utils", "tritonforge"}),
    python: tuple[int, int] = CONTAINER_PYTHON,
) -> list[str]:
    """Syntax of ``python`` and imports the image provides, for every file the image runs."""
    allowed = set(sys.stdlib_module_names) | set(extra_allowed)
    allowed |= {name.replace("-", "_") for name in pins(requirements)}
    out: list[str] = []
    for path, top_only in [(p, False) for p in code.model_files] + [
        (p, True) for p in code.package_files
    ]:
        src = path.read_text()
        try:
            tree = ast.parse(src, filename=str(path), feature_version=CONTAINER_PYTHON)
        except SyntaxError as e:
            out.append(
                f"{path}: not Python {CONTAINER_PYTHON[0]}.{CONTAINER_PYTHON[1]} syntax: {e}"
            )
            continue
        for name in module_imports(tree, top_only):
            parts = name.split(".")
            if parts[0] not in allowed:
                out.append(f"{path}: imports {name}, which the image does not install")
            if python < (3, 11) and PY311_ONLY & set(parts):
                out.append(f"{path}: {name} needs Python 3.11; the container has 3.10")
    return out
