"""``make bench``'s task sections: each task whose load tests give a ``bench_section`` measures its
default pipeline there (served vs in-process, one run, ratios), beside the main table.

A task declares it in its folder (``tasks/<task>/loadtest``: ``bench_section(client, repository)
-> list of cells``, ``[]`` when its default model is not exported); this module names no task.

    python -m tritonforge.loadtest.bench.sections --model-repository model_repository
    python -m tritonforge.loadtest.bench.sections --grpc-url host:8001   # a running server
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tritonforge import tasks

log = logging.getLogger(__name__)
Section = Callable[[Any, Path], list[dict[str, Any]]]


def task_sections() -> dict[str, Section]:
    """Every registered task's ``loadtest.bench_section``, by task name (registry order)."""
    found: dict[str, Section] = {}
    for name in tasks.names():
        try:
            loadtest = tasks.get(name).module("loadtest")
        except ModuleNotFoundError:
            continue
        section = getattr(loadtest, "bench_section", None)
        if section is not None:
            found[name] = section
    return found


@contextlib.contextmanager
def _grpc_url(args: argparse.Namespace) -> Iterator[tuple[str, str | None]]:
    """``(gRPC address, admin key)``: the given server's, or an embedded one's for the block."""
    if args.grpc_url:
        yield args.grpc_url, os.environ.get("TRITONFORGE_ADMIN_KEY")
        return
    from tritonforge.runtime.serving import serving

    with serving(args.model_repository) as server:
        yield server.grpc_url, server.settings.admin_key


def run_sections(
    sections: dict[str, Section], client: Any, repository: Path
) -> list[dict[str, Any]]:
    """Each section's cells, tagged with its task; a section that fails is a cell saying why."""
    cells: list[dict[str, Any]] = []
    for task, section in sections.items():
        log.info("==> bench section: %s", task)
        try:
            cells += [{"task": task, **cell} for cell in section(client, repository)]
        except Exception as e:  # one task's failure must not lose the others' figures
            log.exception("bench section %s failed", task)
            cells.append({"task": task, "cell": "failed", "error": f"{type(e).__name__}: {e}"})
    return cells


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="make bench's per-task sections")
    parser.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--grpc-url", help="a running server's gRPC address (default: embedded)")
    parser.add_argument("--out", type=Path, default=Path("build/bench_sections.json"))
    args = parser.parse_args(argv)
    from tritonforge.client import EmbeddingClient

    sections = task_sections()
    with contextlib.ExitStack() as stack:
        url, admin_key = stack.enter_context(_grpc_url(args))
        client = stack.enter_context(EmbeddingClient(url=url, protocol="grpc", admin_key=admin_key))
        cells = run_sections(sections, client, args.model_repository)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(cells, indent=2) + "\n")
    for cell in cells:
        print(json.dumps(cell))
    log.info("==> %d cells from %d task sections -> %s", len(cells), len(sections), args.out)
    return 1 if any(c.get("cell") == "failed" for c in cells) else 0


if __name__ == "__main__":
    from tritonforge.logs import run_main

    raise SystemExit(run_main(main))
