"""make bench's task sections: found through the registry, one failure never loses the others."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tritonforge import tasks
from tritonforge.loadtest.bench import sections


def test_every_task_with_a_bench_section_is_found_in_registry_order() -> None:
    found = sections.task_sections()
    assert {"rerank", "image"} <= set(found)
    assert list(found) == [n for n in tasks.names() if n in found]
    for name, section in found.items():
        assert section.__module__.startswith(tasks.get(name).package)


def test_a_failing_section_is_a_cell_and_the_others_still_run(tmp_path: Path) -> None:
    def broken(client: Any, repository: Path) -> list[dict[str, Any]]:
        raise RuntimeError("server gone")

    def fine(client: Any, repository: Path) -> list[dict[str, Any]]:
        return [{"cell": "ok", "repository": str(repository)}]

    cells = sections.run_sections({"a": broken, "b": fine}, object(), tmp_path)
    assert cells == [
        {"task": "a", "cell": "failed", "error": "RuntimeError: server gone"},
        {"task": "b", "cell": "ok", "repository": str(tmp_path)},
    ]


def test_sections_skip_a_repository_without_their_default_model(tmp_path: Path) -> None:
    for name, section in sections.task_sections().items():
        assert section(object(), tmp_path) == [], name
