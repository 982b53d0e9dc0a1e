"""Rewrite imports of the top-level packages (``client``, ``deploy``, ``export``, ``loadtest``,
``runtime``) to the ``tritonforge`` namespace the wheel installs (``from client.sync import X`` ->
``from tritonforge.client.sync import X``). Mechanical and idempotent: re-run it after merging a
branch written against the old names.

    python tools/namespace_imports.py            # rewrite the git-tracked files in place
    python tools/namespace_imports.py --check    # list what would change; exit 1 if anything
    python tools/namespace_imports.py --reverse  # the inverse (old names), e.g. before a merge
    .venv/bin/ruff check --fix . && .venv/bin/ruff format .   # then: re-sort the imports

What it rewrites (nothing else): in ``*.py`` files, ``from PKG[.mod] import`` statements and
quoted dotted module paths that exist in the tree (``"loadtest.bench"``, mock/logger targets such
as ``"client.retry"``); in ``*.py``, ``*.md``, ``Makefile``, ``.ci/run`` and Dockerfiles, ``-m PKG[.mod]``
command lines (``python -m runtime serve`` -> ``python -m tritonforge.runtime serve``). The
folders stay where they are: ``tritonforge/PKG`` are symlinks to them.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys  # namespace-imports: skip-file
from collections.abc import Callable, Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = "tritonforge"
PACKAGES = ("client", "deploy", "export", "loadtest", "runtime")
_PKG = "|".join(PACKAGES)
FROM_IMPORT = re.compile(rf"^(?P<indent>[ \t]*)from (?P<mod>(?:{_PKG})(?:\.\w+)*) import ", re.M)
PLAIN_IMPORT = re.compile(rf"^[ \t]*import (?:{_PKG})\b", re.M)
QUOTED_PATH = re.compile(rf"(?P<q>[\"'])(?P<mod>(?:{_PKG})(?:\.\w+)+)(?P=q)")
DASH_M = re.compile(rf"(?P<flag>-m[\"']?,?\s*[\"']?)(?P<mod>(?:{_PKG})(?:\.\w+)*)(?![\w/.-])")
NS_FROM_IMPORT = re.compile(
    rf"^(?P<indent>[ \t]*)from {NAMESPACE}\.(?P<mod>(?:{_PKG})(?:\.\w+)*) import ", re.M
)
NS_QUOTED_PATH = re.compile(rf"(?P<q>[\"']){NAMESPACE}\.(?P<mod>(?:{_PKG})(?:\.\w+)+)(?P=q)")
NS_DASH_M = re.compile(
    rf"(?P<flag>-m[\"']?,?\s*[\"']?){NAMESPACE}\.(?P<mod>(?:{_PKG})(?:\.\w+)*)(?![\w/.-])"
)
TEXT_FILES = ("Makefile", ".ci/run")
SKIP_MARKER = "namespace-imports: skip-file"  # in a file that shows the old forms on purpose


class NamespaceError(Exception):
    """A file uses a form this script does not rewrite (fix it by hand, then re-run)."""


def is_module_path(dotted: str, root: Path = ROOT) -> bool:
    """True when ``dotted`` or a prefix of it (``module.attribute``) is a module of the tree."""
    parts = dotted.split(".")
    for n in range(len(parts), 1, -1):
        base = root.joinpath(*parts[:n])
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            return True
    return False


def rewrite_python(text: str, root: Path = ROOT) -> str:
    """The rewritten source of one Python file."""
    if PLAIN_IMPORT.search(text):
        line = PLAIN_IMPORT.search(text)
        raise NamespaceError(
            f"plain `import PKG` at {line.group(0).strip()!r}: use `from PKG import x`"  # type: ignore[union-attr]
        )
    text = FROM_IMPORT.sub(lambda m: f"{m['indent']}from {NAMESPACE}.{m['mod']} import ", text)
    text = QUOTED_PATH.sub(
        lambda m: (
            f"{m['q']}{NAMESPACE}.{m['mod']}{m['q']}"
            if is_module_path(m["mod"], root)
            else m.group(0)
        ),
        text,
    )
    return rewrite_commands(text)


def rewrite_commands(text: str) -> str:
    """``-m PKG[.mod]`` (shell lines, ``[..., "-m", "PKG.mod"]`` argument lists) -> namespaced."""
    return DASH_M.sub(lambda m: f"{m['flag']}{NAMESPACE}.{m['mod']}", text)


def reverse_python(text: str, root: Path = ROOT) -> str:
    """The inverse of :func:`rewrite_python` (back to the old names, e.g. to merge a branch
    written against them before re-applying the rewrite)."""
    text = NS_FROM_IMPORT.sub(lambda m: f"{m['indent']}from {m['mod']} import ", text)
    text = NS_QUOTED_PATH.sub(
        lambda m: f"{m['q']}{m['mod']}{m['q']}" if is_module_path(m["mod"], root) else m.group(0),
        text,
    )
    return reverse_commands(text)


def reverse_commands(text: str) -> str:
    return NS_DASH_M.sub(lambda m: f"{m['flag']}{m['mod']}", text)


def tracked_files(root: Path = ROOT) -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    return [root / n for n in names if (root / n).is_file() and not (root / n).is_symlink()]


def rewriter(path: Path, root: Path = ROOT, reverse: bool = False) -> Callable[[str], str] | None:
    rel = path.relative_to(root).as_posix()
    if path.suffix == ".py":
        python = reverse_python if reverse else rewrite_python
        return lambda text: python(text, root)
    if path.suffix == ".md" or rel in TEXT_FILES or path.name.startswith("Dockerfile"):
        return reverse_commands if reverse else rewrite_commands
    return None


def run(files: Iterable[Path], check: bool, root: Path = ROOT, reverse: bool = False) -> list[Path]:
    """Rewrite ``files`` (or only report them with ``check``); the files that change."""
    changed = []
    for path in files:
        fn = rewriter(path, root, reverse)
        if fn is None:
            continue
        text = path.read_text()
        if SKIP_MARKER in text:
            continue
        new = fn(text)
        if new != text:
            changed.append(path)
            if not check:
                path.write_text(new)
    return changed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--check", action="store_true", help="report only; exit 1 if a file would change"
    )
    p.add_argument("--reverse", action="store_true", help="back to the old top-level names")
    args = p.parse_args(argv)
    try:
        changed = run(tracked_files(), args.check, reverse=args.reverse)
    except NamespaceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for path in changed:
        print(f"{'would rewrite' if args.check else 'rewrote'} {path.relative_to(ROOT)}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    raise SystemExit(main())
