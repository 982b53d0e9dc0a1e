"""tools/namespace_imports.py: the mechanical rewrite to the tritonforge namespace.

namespace-imports: skip-file (the fixtures below show the old forms on purpose)
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import PROJECT_ROOT


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "namespace_imports", PROJECT_ROOT / "tools" / "namespace_imports.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ns = load()

BEFORE = '''"""Doc: run ``python -m runtime serve``."""
from client.sync import EmbeddingClient
from deploy import gpu_check
import json


def f() -> None:
    from loadtest.perf_analyzer import binary
    cmd = [sys.executable, "-m", "loadtest.bench", "--x"]
    logging.getLogger("client.retry")
    report = "loadtest.html"
    name = "export"
    monkeypatch.setattr("client.sync.EmbeddingClient.embed", fake)
'''
AFTER = '''"""Doc: run ``python -m tritonforge.runtime serve``."""
from tritonforge.client.sync import EmbeddingClient
from tritonforge.deploy import gpu_check
import json


def f() -> None:
    from tritonforge.loadtest.perf_analyzer import binary
    cmd = [sys.executable, "-m", "tritonforge.loadtest.bench", "--x"]
    logging.getLogger("tritonforge.client.retry")
    report = "loadtest.html"
    name = "export"
    monkeypatch.setattr("tritonforge.client.sync.EmbeddingClient.embed", fake)
'''


def test_python_imports_module_strings_and_commands_are_namespaced() -> None:
    assert ns.rewrite_python(BEFORE) == AFTER


def test_reverse_is_the_inverse() -> None:
    assert ns.reverse_python(AFTER) == BEFORE
    assert ns.rewrite_python(ns.reverse_python(AFTER)) == AFTER
    assert ns.reverse_commands("python -m tritonforge.runtime serve") == "python -m runtime serve"


def test_the_rewrite_is_idempotent() -> None:
    assert ns.rewrite_python(AFTER) == AFTER
    text = "\t$(PY) -m tritonforge.runtime serve\n"
    assert ns.rewrite_commands(text) == text


def test_shell_lines_and_docs() -> None:
    assert (
        ns.rewrite_commands("python -m loadtest.perf_analyzer install; python -m export clean")
        == "python -m tritonforge.loadtest.perf_analyzer install; "
        "python -m tritonforge.export clean"
    )
    untouched = "see deploy/validate.py and --model-repository, rm -rf build"
    assert ns.rewrite_commands(untouched) == untouched


def test_files_with_the_marker_are_left_alone(tmp_path: Path) -> None:
    old = f"from client.sync import X  # {ns.SKIP_MARKER}\n"
    (tmp_path / "a.py").write_text(old)
    assert ns.run([tmp_path / "a.py"], check=False, root=tmp_path) == []
    assert (tmp_path / "a.py").read_text() == old


def test_a_plain_import_is_refused_naming_it() -> None:
    with pytest.raises(ns.NamespaceError, match="import client"):
        ns.rewrite_python("import client.sync\n")


def test_only_modules_of_the_tree_count(tmp_path: Path) -> None:
    (tmp_path / "client").mkdir()
    (tmp_path / "client" / "__init__.py").write_text("")
    (tmp_path / "client" / "sync.py").write_text("")
    assert ns.is_module_path("client.sync", tmp_path)
    assert ns.is_module_path("client.sync.EmbeddingClient", tmp_path)
    assert not ns.is_module_path("client.html", tmp_path)
