"""Atomic writes into the model repository, input fingerprints for skipping, and cleaning.

Everything is built in a staging directory next to the repository (``<parent>/.tritonforge/
export-staging/``: same filesystem, but invisible to a Triton server polling the repository),
verified there, and only then moved in with ``os.replace``. Until :meth:`Staging.commit` runs, the
repository is untouched; an exception before it leaves it byte-for-byte as it was.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import tritonforge
from tritonforge import tasks
from tritonforge.errors import ArtifactIntegrityError
from tritonforge.export.errors import ExportError
from tritonforge.export.report import REPORT_JSON
from tritonforge.export.spec import ExportSpec, digest_json
from tritonforge.integrity import sha256_file, verify_sidecar, write_sidecar

STAGING_PREFIX = "export-"
EXPORTER_VERSION = "1"
LIBRARIES = ("torch", "onnx", "onnxruntime", "numpy", "tokenizers", "tritonclient")
EXPORT_ROOT = Path(__file__).resolve().parent


def staging_parent(repo: Path) -> Path:
    return repo.resolve().parent / ".tritonforge" / "export-staging"


def library_versions() -> dict[str, str]:
    versions = {}
    for lib in LIBRARIES:
        try:
            versions[lib] = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:
            versions[lib] = "not installed"
    return versions


# the core modules that decide what an encoder export writes: the config layer (every
# config.pbtxt is rendered there), the tokenizer path (calibration and verification inputs) and
# the model names
CORE_MODULES = ("configschema.py", "modelconfig.py", "text.py", "pipelines.py")
CORE_ROOT = Path(tritonforge.__file__).resolve().parent  # in a checkout export/ is a link in it
# the task folders: each task's share of the export (tritonforge.tasks)
TASKS_ROOT = CORE_ROOT / "tasks"


def _own_digest(rel: str) -> bool:
    """True for a source a task fingerprints itself (``Task.export_sources``: the decoder's and
    the classifier trainer's code), which the shared digest leaves out."""
    return any(rel == s or rel.startswith(s + "/") for s in tasks.export_sources())


def _sources(root: Path, prefix: str) -> list[tuple[str, Path]]:
    out = []
    for path in sorted(root.rglob("*")):
        rel = f"{prefix}/{path.relative_to(root).as_posix()}"
        if _own_digest(rel) or not path.is_file() or "__pycache__" in path.parts:
            continue
        if path.suffix in (".py", ".txt"):
            out.append((rel, path))
    return out


# Where a task's export code starts in its folder: its declaration and its export module or
# package (with its data files); the rest of the folder counts only where these import it.
EXPORT_ROOTS = ("__init__.py", "export.py", "export")


def _module_file(module: str) -> Path | None:
    """The source of ``tritonforge.tasks...`` ``module`` (a module or a package), if any."""
    parts = module.split(".")[2:]
    base = TASKS_ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if parts and candidate.is_file():
            return candidate
    return None


def _task_imports(path: Path) -> set[str]:
    """The ``tritonforge.tasks`` modules ``path`` (under :data:`TASKS_ROOT`) imports, absolute or
    relative, at any depth (a function's lazy import too); ``from m import x`` yields ``m.x``."""
    rel = path.relative_to(TASKS_ROOT).with_suffix("")
    package = ["tritonforge", "tasks", *rel.parts[:-1]]  # a module's or an __init__'s package
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return {m for m in found if m.startswith("tritonforge.tasks.")}


def task_export_files(task: str) -> list[tuple[str, Path]]:
    """The task-folder files that determine ``task``'s export artifacts, as ``(tasks/..., path)``:
    its export code (:data:`EXPORT_ROOTS`) and every task-folder module that code imports,
    transitively (with their packages' ``__init__``). What no export code imports (the client,
    load tests, routes, docs) never re-exports anything. Stage sources are not here: the exports
    copy them into the repository on every run, up to date or not."""
    folder = TASKS_ROOT / tasks.get(task).folder.name
    todo: list[Path] = []
    for name in EXPORT_ROOTS:
        root = folder / name
        todo += sorted(root.rglob("*")) if root.is_dir() else [root]
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file() or "__pycache__" in path.parts:
            continue
        if path.suffix not in (".py", ".txt"):
            continue
        seen.add(path)
        if path.suffix == ".py":
            modules = _task_imports(path)
            todo += [f for m in modules if (f := _module_file(m)) is not None]
            todo += [p / "__init__.py" for p in path.parents if p.is_relative_to(TASKS_ROOT)]
    return sorted((f"tasks/{p.relative_to(TASKS_ROOT).as_posix()}", p) for p in seen)


def code_digest(task: str | None = None) -> str:
    """sha256 over the exporter's own sources and data, :data:`CORE_MODULES` and ``task``'s
    export code (:func:`task_export_files`; no other task's), less what tasks fingerprint
    themselves (``Task.export_sources``): a change of code that writes the artifacts re-exports,
    an edit of a client or a load test does not."""
    h = hashlib.sha256()
    for rel, path in _sources(EXPORT_ROOT, "export"):
        h.update(rel.removeprefix("export/").encode())
        h.update(path.read_bytes())
    for rel, path in task_export_files(task) if task else []:
        if not _own_digest(rel):
            h.update(rel.encode())
            h.update(path.read_bytes())
    for name in CORE_MODULES:
        h.update(name.encode())
        h.update((CORE_ROOT / name).read_bytes())
    return h.hexdigest()


def _task_of(spec: ExportSpec) -> str | None:
    """The registered task whose export ``spec`` is (its serving section names it), or None."""
    task = spec.serving.task if spec.serving is not None else ""
    return task if task in tasks.registry() else None


def fingerprint(spec: ExportSpec, options: dict[str, Any]) -> dict[str, Any]:
    """Everything the export depends on; equal fingerprints mean an identical export."""
    parts = {
        "exporter_version": EXPORTER_VERSION,
        "code": code_digest(_task_of(spec)),
        "spec": digest_json(spec.fingerprint_data()),
        "sources": {str(p.name): sha256_file(p) for p in spec.source_files},
        "libraries": library_versions(),
        "options": options,
    }
    return {"digest": digest_json(parts), **parts}


def up_to_date(repo: Path, artifacts: Iterable[str], digest: str) -> tuple[bool, str]:
    """True when every artifact (repo-relative path) exists, matches its sidecar, and the report
    beside each recorded ``digest``. Returns ``(ok, reason)``."""
    for rel in artifacts:
        path = repo / rel
        if not path.exists():
            return False, f"{rel} does not exist"
        try:
            verify_sidecar(path, required=True)
        except ArtifactIntegrityError as e:
            return False, str(e)
        if path.suffix in (".onnx", ".pt"):
            report = path.parent / REPORT_JSON
            try:
                recorded = json.loads(report.read_text())["fingerprint"]["digest"]
            except (OSError, KeyError, ValueError):
                return False, f"{report.relative_to(repo)} is missing or unreadable"
            if recorded != digest:
                return False, f"inputs changed since {rel} was exported"
    return True, "inputs unchanged"


class Staging:
    """A scratch copy of the parts of the repository an export writes.

    ``whole_dirs`` (repo-relative) are replaced as a unit (a model version directory); every
    other staged file replaces the file at the same path, leaving its siblings alone (e.g.
    ``tokenizer/1/model.py`` owned by another stage).
    """

    def __init__(self, repo: Path) -> None:
        repo.mkdir(parents=True, exist_ok=True)
        self.repo = repo
        parent = staging_parent(repo)
        parent.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=parent))
        self.whole_dirs: list[str] = []
        self.removed_dirs: list[str] = []

    def path(self, rel: str | Path) -> Path:
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def version_dir(self, model: str, version: int) -> Path:
        return self.whole_dir(f"{model}/{version}")

    def whole_dir(self, rel: str) -> Path:
        """A staged directory that replaces ``rel`` in the repository as a unit."""
        if rel not in self.whole_dirs:
            self.whole_dirs.append(rel)
        d = self.root / rel
        d.mkdir(parents=True, exist_ok=True)
        return d

    def remove_dir(self, rel: str) -> None:
        """Have the commit take ``rel`` out of the repository (one ``os.replace`` aside, after
        everything staged is in), e.g. a model an export no longer serves under that name."""
        if rel not in self.removed_dirs:
            self.removed_dirs.append(rel)

    def seal(self) -> list[str]:
        """Write a ``.sha256`` sidecar for every artifact (model and data files) staged."""
        sealed = []
        for path in sorted(self.root.rglob("*")):
            if path.relative_to(self.root).parts[0].startswith("."):
                continue  # scratch space (.work, .replaced)
            if (
                path.is_file()
                and path.suffix in (".onnx", ".pt", ".json", ".data")
                and not (path.name.startswith("export_report"))
            ):
                write_sidecar(path)
                sealed.append(str(path.relative_to(self.root)))
        return sealed

    def commit(self) -> list[str]:
        """Move everything staged into the repository (``os.replace``), then the removed
        directories out of it; returns the paths moved in."""
        moved: list[str] = []
        trash = self.root / ".replaced"

        def aside(rel: str) -> None:
            if (self.repo / rel).exists():
                (trash / rel).parent.mkdir(parents=True, exist_ok=True)
                os.replace(self.repo / rel, trash / rel)

        for rel in self.whole_dirs:
            src, dst = self.root / rel, self.repo / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            aside(rel)
            os.replace(src, dst)
            moved.append(rel)
        for path in sorted(self.root.rglob("*")):
            rel_path = path.relative_to(self.root)
            if not path.is_file() or rel_path.parts[0].startswith("."):
                continue
            dst = self.repo / rel_path
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, dst)
            moved.append(str(rel_path))
        for rel in self.removed_dirs:
            aside(rel)
        return moved

    def discard(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def clean(repo: Path, models: Iterable[str]) -> list[str]:
    """Remove what the exporter generated: the directories of ``models`` (every model of the
    pipelines, :meth:`PipelineSpec.model_names`) and stale staging directories."""
    removed: list[str] = []
    if not repo.exists():
        return removed
    for stale in staging_parent(repo).glob(f"{STAGING_PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)
        removed.append(stale.name)
    for name in models:
        if (repo / name).exists():
            shutil.rmtree(repo / name)
            removed.append(name)
    return removed


def ensure_inside(repo: Path, path: Path) -> None:
    if repo.resolve() not in path.resolve().parents:
        raise ExportError(f"{path} is outside the model repository {repo}")
