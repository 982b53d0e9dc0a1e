"""Relative links between the project's Markdown pages resolve: the file exists and, where a
link names a section (``page.md#anchor``), a heading of that page has that anchor (GitHub's
slug rule). Pages move and split; a dead link is found here, not by a reader."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([PROJECT_ROOT / "README.md", *(PROJECT_ROOT / "docs").glob("*.md")])
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_fence = False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
        if in_fence or not line.startswith("#"):
            continue
        base = slug(line.lstrip("#"))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[str]:
    out = []
    in_fence = False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
        if not in_fence:
            out += LINK.findall(line)
    return out


def dead_links(page: Path) -> list[str]:
    dead = []
    for target in links(page):
        if re.match(r"^[a-z]+:", target) or target.startswith("<"):
            continue  # a URL or a mail address
        path_part, _, anchor = target.partition("#")
        linked = (page.parent / path_part).resolve() if path_part else page
        if not linked.exists():
            dead.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            dead.append(f"{target}: no heading with that anchor in {linked.name}")
    return dead


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    assert not dead_links(page), dead_links(page)


def test_the_check_finds_a_dead_file_and_a_dead_anchor(tmp_path: Path) -> None:
    page = tmp_path / "a.md"
    (tmp_path / "b.md").write_text("# Title\n\n## A `code` section (issue #3)\n")
    page.write_text(
        "[ok](b.md#a-code-section-issue-3) [no file](c.md) [no anchor](b.md#missing) "
        "[url](https://example.com/x.md#y)\n"
    )
    assert dead_links(page) == [
        "c.md: no such file",
        "b.md#missing: no heading with that anchor in b.md",
    ]
