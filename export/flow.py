"""The one export flow every task runs: fingerprint -> skip when up to date -> stage -> the task's
steps (build, export, verify) -> seal (sidecars, artifact digests, timings, reports) -> commit.

A task plugs in as a :class:`Task`: what it plans to write, how it fingerprints its inputs and how
it builds into a :class:`Staging`; staging, skipping, timing, progress, sealing, report writing and
the atomic commit are written here once. Until the commit, the model repository is untouched; an
exception in any step leaves it byte-for-byte as it was.
"""

from __future__ import annotations

import datetime
import resource
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tritonforge.export.errors import VerificationError
from tritonforge.export.report import Render, write_report
from tritonforge.export.staging import Staging, up_to_date
from tritonforge.export.step_bar import StepBar, previous_timings
from tritonforge.integrity import sha256_file

Progress = Callable[[str], None]


@dataclass
class Outcome:
    skipped: bool
    report: dict[str, Any] = field(default_factory=dict)
    moved: list[str] = field(default_factory=list)
    generated: list[str] = field(default_factory=list)


def cpu_seconds() -> float:
    """User + system CPU seconds of this process (all its threads) and of its finished children
    (e.g. a model builder run as a subprocess)."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class Steps:
    """Numbered progress lines with per-step timings (and a bar with an ETA when given one).

    ``timings``: wall seconds per step; ``cpu_s``: CPU seconds per step (:func:`cpu_seconds`), so ``cpu_s / timings`` is how many cores the step kept busy (about 1
    for a single-threaded step, up to the thread count otherwise; less on a shared machine).
    """

    def __init__(
        self, spec: str, progress: Progress, bar: StepBar | None = None, title: str = ""
    ) -> None:
        """``title`` heads each step's line (default ``export <spec>``)."""
        self.spec, self.progress, self.bar = spec, progress, bar
        self.title = title or f"export {spec}"
        self.timings: dict[str, float] = {}
        self.cpu_s: dict[str, float] = {}
        self.t0 = time.perf_counter()
        self.cpu0 = cpu_seconds()

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self.progress(f"==> [{self.title}] {name} ...")
        t, cpu = time.perf_counter(), cpu_seconds()
        yield
        self.timings[name] = time.perf_counter() - t
        self.cpu_s[name] = cpu_seconds() - cpu
        self.progress(f"    {name}: {self.timings[name]:.1f} s (CPU {self.cpu_s[name]:.1f} s)")
        if self.bar is not None:
            self.bar.advance(name, self.timings[name])

    def note(self, text: str) -> None:
        self.progress(f"    {text}")

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.t0

    def elapsed_cpu_s(self) -> float:
        """CPU seconds (user + system) of this process since the steps began."""
        return cpu_seconds() - self.cpu0


Build = Callable[[Staging, Steps, dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class Task:
    """What one export plugs into the flow.

    ``planned``: label -> repo-relative file the export writes (the skip check and the ETA read
    them); ``fingerprint``: every input, ``{"digest": ..., ...}``; ``build``: the task's steps,
    writing into the staging and returning the report (it calls :func:`seal` last);
    ``after_commit``: run inside the commit step (e.g. removing an earlier layout's files).
    """

    name: str
    planned: Mapping[str, str]
    fingerprint: Callable[[], dict[str, Any]]
    build: Build
    after_commit: Callable[[], None] | None = None


def run_flow(task: Task, repo: Path, force: bool, progress: Progress, bar: bool) -> Outcome:
    """Run ``task`` into ``repo`` (skipped when its inputs are unchanged, unless ``force``).
    ``bar``: draw a progress bar with an ETA from the previous report's timings (a terminal)."""
    step_bar = StepBar(task.name, previous_timings(repo, task.planned.values())) if bar else None
    try:
        steps = Steps(task.name, step_bar.write if step_bar else progress, step_bar)
        return _run(task, repo, force, steps)
    finally:
        if step_bar is not None:
            step_bar.close()


def _run(task: Task, repo: Path, force: bool, steps: Steps) -> Outcome:
    progress = steps.progress
    with steps("fingerprint inputs"):
        fp = task.fingerprint()
    if not force:
        ok, reason = up_to_date(repo, task.planned.values(), fp["digest"])
        if ok:
            progress(f"==> [export {task.name}] up to date ({reason}); nothing to do")
            return Outcome(skipped=True)
        steps.note(f"exporting: {reason}")
    staging = Staging(repo)
    try:
        report = task.build(staging, steps, fp)
        with steps("commit (os.replace into the repository)"):
            moved = staging.commit()
            if task.after_commit is not None:
                task.after_commit()
        progress(
            f"==> [export {task.name}] done in {steps.elapsed_s():.1f} s: "
            + ", ".join(sorted(task.planned))
        )
        return Outcome(skipped=False, report=report, moved=moved)
    finally:
        staging.discard()


def report_header(
    name: str, description: str, fp: dict[str, Any], libraries: dict[str, str], opset: int
) -> dict[str, Any]:
    """The first keys of every export report (the task adds its own after them)."""
    return {
        "spec": name,
        "description": description,
        "created_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "fingerprint": fp,
        "libraries": libraries,
        "opset": opset,
    }


def check(
    failures: list[str], name: str, error: type[VerificationError] = VerificationError
) -> None:
    """Raise one ``error`` listing every failure (nothing is committed then)."""
    if failures:
        raise error(failures, f"spec {name}")


def seal(
    staging: Staging,
    steps: Steps,
    report: dict[str, Any],
    artifacts: Mapping[str, Path],
    report_dirs: Iterable[Path],
    render: Render,
) -> None:
    """Sidecars for every staged artifact, their sizes and digests, the timings so far and the
    report (JSON + Markdown) in each of ``report_dirs``."""
    staging.seal()
    for label, path in artifacts.items():
        report["artifacts"][label] = {
            "file": str(path.relative_to(staging.root)),
            "bytes": path.stat().st_size,
            "sha256": sha256_file(path),
        }
    steps.timings["total"] = steps.elapsed_s()
    report["timings_s"] = {k: round(v, 3) for k, v in steps.timings.items()}
    steps.cpu_s["total"] = steps.elapsed_cpu_s()
    report["cpu_s"] = {k: round(v, 3) for k, v in steps.cpu_s.items()}
    for directory in report_dirs:
        write_report(report, directory, render)
