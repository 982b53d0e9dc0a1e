"""One spelling per module: code, commands and docs name the packages as ``tritonforge.X``.

The top-level folders users see (``client/``, ``deploy/``, ``export/``, ``loadtest/``,
``runtime/``) are the subpackages ``tritonforge.client`` ... (``tritonforge/X`` links to them). In
a checkout ``import client`` would also work, which gives every module two names, two entries in
``sys.modules`` (two copies of its globals) and an import graph tools cannot read; this test
forbids the second spelling everywhere it can appear.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT

PACKAGES = ("client", "deploy", "export", "loadtest", "runtime")
_PKG = "|".join(PACKAGES)
FROM_IMPORT = re.compile(rf"^[ \t]*from (?:{_PKG})(?:\.\w+)* import ", re.M)
PLAIN_IMPORT = re.compile(rf"^[ \t]*import (?:{_PKG})\b", re.M)
QUOTED_PATH = re.compile(rf"(?P<q>[\"'])(?P<mod>(?:{_PKG})(?:\.\w+)+)(?P=q)")
DASH_M = re.compile(
    rf"-m[\"']?,?(?:\s*\n\s*-)?\s*[\"']?(?P<mod>(?:{_PKG})(?:\.\w+)*)(?![\w/.-])"
)  # also a YAML block list: `- -m` then `- runtime`
TEXT_FILES = ("Makefile", ".ci/run", "docker-compose.yml")


def is_module_path(dotted: str) -> bool:
    """True when ``dotted`` or a prefix of it (``module.attribute``) is a module of the tree."""
    parts = dotted.split(".")
    for n in range(len(parts), 1, -1):
        base = PROJECT_ROOT.joinpath(*parts[:n])
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            return True
    return False


def old_spellings(text: str, python: bool) -> list[str]:
    """The second spellings in ``text``: imports and quoted module paths (Python only) and
    ``-m PKG`` command lines (every kind of file)."""
    found = [m.group(0).strip() for m in DASH_M.finditer(text)]
    if python:
        found += [m.group(0).strip() for m in FROM_IMPORT.finditer(text)]
        found += [m.group(0).strip() for m in PLAIN_IMPORT.finditer(text)]
        found += [m.group(0) for m in QUOTED_PATH.finditer(text) if is_module_path(m["mod"])]
    return found


def checked_files() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files"], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    out = []
    for name in names:
        path = PROJECT_ROOT / name
        if not path.is_file() or path.is_symlink():
            continue
        if (
            path.suffix in (".py", ".md", ".yaml", ".yml")
            or name in TEXT_FILES
            or path.name.startswith("Dockerfile")
        ):
            out.append(path)
    return out


def test_the_tree_uses_one_spelling() -> None:
    offenders = []
    for path in checked_files():
        if path == Path(__file__).resolve():
            continue
        for hit in old_spellings(path.read_text(), python=path.suffix == ".py"):
            offenders.append(f"{path.relative_to(PROJECT_ROOT)}: {hit}")
    assert not offenders, "use the tritonforge.X spelling:\n" + "\n".join(offenders)


@pytest.mark.parametrize(
    "text",
    [
        "from client.sync import EmbeddingClient\n",
        "    from runtime import front\n",
        "import loadtest\n",
        'patch("client.retry.time")\n',
        "python -m runtime serve\n",
        '[sys.executable, "-m", "export.cli"]\n',
        "      - -m\n      - runtime\n",
    ],
)
def test_each_second_spelling_is_found(text: str) -> None:
    assert old_spellings(text, python=True)


@pytest.mark.parametrize(
    "text",
    [
        "from tritonforge.client.sync import EmbeddingClient\n",
        "python -m tritonforge.runtime serve\n",
        '"client.json"\n',  # a file name, not a module
        "from .export import x\n",
    ],
)
def test_the_namespace_spelling_passes(text: str) -> None:
    assert not old_spellings(text, python=True)
