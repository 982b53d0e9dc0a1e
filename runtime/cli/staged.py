"""Serve each pipeline as soon as its export is done (``tritonforge serve`` / ``make run``).

The launcher starts Triton with explicit model control and only the models that are complete on
disk (:func:`servable_models`: every model that lints clean together with everything it calls),
then :class:`BackgroundExports` runs the remaining exports one after the other, each in its own
``tritonforge export`` process, and loads what each one completed through the repository API
(dependencies first) before starting the next. An export commits atomically (staging, then
``os.replace``) and models are only loaded after their export process exited 0, so nothing
half-exported is ever loaded. A failed export leaves the served models serving; its output and a
failure report (JSON) are kept under ``<repository's parent>/.tritonforge/background-exports/``.

Nothing here imports the exporter (torch): the serving process stays light.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tritonforge.errors import ModelConfigError
from tritonforge.logs import LEVELS
from tritonforge.pipelines import from_repository
from tritonforge.repository import load_model_config, referenced_models
from tritonforge.runtime.errors import EmbeddedServerError
from tritonforge.runtime.launcher.lint import lint_by_model
from tritonforge.runtime.launcher.server import TritonLauncher

log = logging.getLogger(__name__)

REPORT_DIR = Path(".tritonforge") / "background-exports"
"""Under the model repository's parent: each job's log and, when it fails, its failure report."""
STOP_TIMEOUT_S = 15.0
QUEUED, EXPORTING, LOADING, STOPPED = "queued", "exporting", "loading", "stopped"


# -- what can be served now ----------------------------------------------------------------------
def calls(repository: Path, model: str) -> list[str]:
    """The models ``model`` calls: its ensemble steps or the BLS targets its parameters declare."""
    cfg = load_model_config(repository, model)
    if cfg.raw.get("platform") == "ensemble":
        steps = cfg.raw.get("ensemble_scheduling", {}).get("step", [])
        return [str(s.get("model_name", "")) for s in steps]
    return list(referenced_models(cfg.parameters).values())


def dependency_order(graph: Mapping[str, Iterable[str]]) -> list[str]:
    """The models of ``graph`` (model -> models it calls), every callee before its callers;
    callees outside ``graph`` are ignored, a cycle is broken where it is met; ties by name."""
    order: list[str] = []
    seen: set[str] = set()

    def visit(node: str) -> None:
        if node in seen:
            return
        seen.add(node)
        for callee in sorted(graph.get(node, ())):
            if callee in graph:
                visit(callee)
        order.append(node)

    for node in sorted(graph):
        visit(node)
    return order


def servable_models(repository: Path) -> tuple[list[str], dict[str, list[str]]]:
    """``(models, problems)``: the models that lint clean and whose callees (transitively) do,
    in load order (callees first); and, for every other model, why it cannot be loaded."""
    by_model = lint_by_model(repository)
    problems = {m: p for m, p in by_model.items() if p and m}
    graph: dict[str, list[str]] = {}
    for model in by_model:
        if model and model not in problems:
            try:
                graph[model] = calls(repository, model)
            except ModelConfigError as e:
                problems[model] = [str(e)]
    changed = True
    while changed:  # a model calling a model that cannot load cannot load either
        changed = False
        for model, callees in list(graph.items()):
            broken = [c for c in callees if c not in graph]
            if broken:
                problems[model] = [f"{model}: needs {', '.join(broken)} (not servable yet)"]
                del graph[model]
                changed = True
    return dependency_order(graph), problems


def public_units(repository: Path, models: Iterable[str]) -> dict[str, list[str]]:
    """What a user calls among ``models``: pipeline name -> its public models (from the
    ``tritonforge.*`` parameters), and every model no other of ``models`` calls (e.g. the
    decoupled ``generate``) -> ``[itself]``."""
    loaded = set(models)
    units: dict[str, list[str]] = {}
    members: set[str] = set()
    for name, pipeline in from_repository(repository).items():
        members |= set(pipeline.models)
        public = [m for m in pipeline.public_models if m in loaded]
        if public:
            units[name] = public
    called = {c for m in loaded for c in calls(repository, m)}
    for model in sorted(loaded - members - called):
        units[model] = [model]
    return units


def files_stamp(directory: Path) -> tuple[int, int]:
    """(number of files, newest mtime in ns) under ``directory``: changes when an export
    replaces or rewrites anything there."""
    stats = [p.stat().st_mtime_ns for p in directory.rglob("*") if p.is_file()]
    return len(stats), max(stats, default=0)


def _interrupt(process: subprocess.Popen[str]) -> None:
    """SIGINT to ``process``'s group, SIGKILL after :data:`STOP_TIMEOUT_S`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


# -- the jobs ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExportJob:
    """One ``tritonforge export`` run: ``argv`` are its arguments."""

    argv: tuple[str, ...]

    @property
    def label(self) -> str:
        """The spec's name, else ``--name``, else the ``--from-pretrained`` directory's name."""
        if self.argv and not self.argv[0].startswith("-"):
            return self.argv[0]
        p = argparse.ArgumentParser(add_help=False)
        p.add_argument("--name")
        p.add_argument("--from-pretrained")
        known, _ = p.parse_known_args(self.argv)
        return str(known.name or Path(known.from_pretrained or "export").name)

    @classmethod
    def parse(cls, text: str) -> ExportJob:
        """From one shell-quoted argument string (``--background-export``)."""
        return cls(tuple(shlex.split(text)))


@dataclass
class JobState:
    job: ExportJob
    state: str = QUEUED
    since_s: float = field(default_factory=time.monotonic)
    failure: str = ""
    report: Path | None = None


def default_export_command() -> list[str]:
    """``tritonforge`` in this interpreter, at this process's log level."""
    level = logging.getLevelName(logging.getLogger("tritonforge").getEffectiveLevel()).lower()
    return [
        sys.executable,
        "-m",
        "tritonforge",
        *(("--log-level", level) if level in LEVELS else ()),
    ]


UpCallback = Callable[[str, dict[str, list[str]]], None]
"""Called with the job's label and the newly served units (:func:`public_units`)."""


class BackgroundExports:
    """Run ``jobs`` in order in a thread, each in a ``tritonforge export`` process, and load
    what each completes into ``server`` (explicit model control).

    ``loaded`` are the models already served. ``on_up`` is called after each job that brought
    models up; :meth:`building` and :meth:`failed` feed the pipeline health endpoint.
    """

    def __init__(
        self,
        server: TritonLauncher,
        jobs: Sequence[ExportJob],
        loaded: Iterable[str] = (),
        on_up: UpCallback | None = None,
        on_models: Callable[[list[str]], None] | None = None,
        export_command: Sequence[str] | None = None,
        t0: float | None = None,
        load_timeout_s: float = 300.0,
        echo: Callable[[str], None] | None = None,
    ) -> None:
        self.server = server
        self.repository = Path(server.settings.model_repository)
        self.report_dir = self.repository.resolve().parent / REPORT_DIR
        self.states = [JobState(job) for job in jobs]
        self.loaded: list[str] = list(loaded)
        self._stamps = {m: files_stamp(self.repository / m) for m in self.loaded}
        self.on_up = on_up
        self.on_models = on_models
        self.export_command = list(export_command or default_export_command())
        self.t0 = time.monotonic() if t0 is None else t0
        self.load_timeout_s = load_timeout_s
        self.echo = echo or (lambda line: print(line, flush=True))
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._process: subprocess.Popen[str] | None = None
        self._thread = threading.Thread(target=self._run, name="background-exports", daemon=True)

    # -- state for the health endpoint ------------------------------------------------------------
    def building(self) -> dict[str, str]:
        """Label -> "queued" | "exporting for N s" | "loading" for every job not finished."""
        now = time.monotonic()
        with self._lock:
            return {
                s.job.label: (
                    f"{s.state} for {now - s.since_s:.0f} s" if s.state == EXPORTING else s.state
                )
                for s in self.states
                if s.state in (QUEUED, EXPORTING, LOADING)
            }

    def failed(self) -> dict[str, str]:
        """Label -> why it failed and where its failure report is."""
        with self._lock:
            return {
                s.job.label: f"{s.failure}; report: {s.report}"
                for s in self.states
                if s.state == "failed"
            }

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> BackgroundExports:
        if not self.states:
            self.done.set()
            return self
        self._thread.start()
        return self

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until every job finished (or ``timeout_s``); True when they did."""
        return self.done.wait(timeout_s)

    def stop(self) -> None:
        """Interrupt the running export (its staging is discarded) and run no other."""
        self._stop.set()
        process = self._process
        if process is not None and process.poll() is None:
            _interrupt(process)
        if self._thread.is_alive():
            self._thread.join(STOP_TIMEOUT_S)

    def _set(self, state: JobState, value: str) -> None:
        with self._lock:
            state.state, state.since_s = value, time.monotonic()

    def _run(self) -> None:
        try:
            for state in self.states:
                if self._stop.is_set():
                    break
                self._one(state)
        finally:
            self.done.set()

    def _one(self, state: JobState) -> None:
        job = state.job
        self._set(state, EXPORTING)
        started = time.monotonic()
        code, log_path = self._export(job)
        if self._stop.is_set():  # interrupted: its staging is discarded, nothing was loaded
            self._set(state, STOPPED)
            return
        took = time.monotonic() - started
        if code != 0:
            self._fail(state, f"export failed after {took:.0f} s (exit status {code})", log_path)
            return
        self._set(state, LOADING)
        try:
            newly = self._load()
        except (EmbeddedServerError, OSError, ModelConfigError) as e:
            if self._stop.is_set():  # the server is shutting down under the load
                return
            self._fail(state, f"export done in {took:.0f} s, but loading failed: {e}", log_path)
            return
        self._set(state, "done")
        units = public_units(self.repository, newly) if newly else {}
        after = time.monotonic() - self.t0
        for name, models in units.items():
            log.info(
                "==> pipeline %s up after %.0f s (export %s took %.0f s; models: %s)",
                name,
                after,
                job.label,
                took,
                ", ".join(models),
            )
        if not units:
            log.info("==> export %s done in %.0f s: nothing new to load", job.label, took)
        if units and self.on_up is not None:
            self.on_up(job.label, units)

    def _export(self, job: ExportJob) -> tuple[int, Path]:
        """Run the export, echoing and logging its output; returns (exit status, log path)."""
        self.report_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.report_dir / f"{job.label}.log"
        argv = [*self.export_command, "export", *job.argv]
        if "--model-repository" not in job.argv:
            argv += ["--model-repository", str(self.repository)]
        log.info(
            "==> exporting %s in the background: tritonforge %s",
            job.label,
            shlex.join(argv[len(self.export_command) :]),
        )
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(log_path, "w") as out:
            out.write(f"$ {shlex.join(argv)}\n")
            self._process = process = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                errors="replace",
                env=env,
                start_new_session=True,  # Ctrl-C reaches the server; stop() interrupts this
            )
            if self._stop.is_set():  # stop() ran before the process existed
                os.killpg(process.pid, signal.SIGINT)
            assert process.stdout is not None
            for line in process.stdout:
                out.write(line)
                out.flush()
                self.echo(line.rstrip("\n"))
            code = process.wait()
        self._process = None
        return code, log_path

    def _load(self) -> list[str]:
        """Load every servable model that is not loaded, and reload those whose files changed
        since (a re-export), callees first; returns the new ones."""
        models, _ = servable_models(self.repository)
        newly = [m for m in models if m not in self.loaded]
        for model in models:
            stamp = files_stamp(self.repository / model)
            if model in self.loaded and self._stamps.get(model) == stamp:
                continue
            self.server.load_model(model, timeout_s=self.load_timeout_s)
            self._stamps[model] = stamp
            if model not in self.loaded:
                self.loaded.append(model)
        # a supervisor restart brings back everything that is up now
        self.server.settings.load_models = list(self.loaded)
        if newly and self.on_models is not None:
            self.on_models(newly)
        return newly

    def _fail(self, state: JobState, why: str, log_path: Path) -> None:
        lines = log_path.read_text(errors="replace").splitlines()[1:]  # after the command
        errors = [line for line in lines if "error" in line.lower() or "failed" in line.lower()]
        report = self.report_dir / f"{state.job.label}.failed.json"
        report.write_text(
            json.dumps(
                {
                    "job": state.job.label,
                    "command": ["tritonforge", "export", *state.job.argv],
                    "failure": why,
                    "error_lines": errors[-20:],
                    "log_tail": lines[-40:],
                    "log": str(log_path),
                    "still_serving": list(self.loaded),
                    "finished_unix_s": time.time(),
                },
                indent=2,
            )
            + "\n"
        )
        with self._lock:
            state.state, state.failure, state.report = "failed", why, report
        last = errors[-1].strip() if errors else (lines[-1].strip() if lines else "")
        log.error(
            "export %s FAILED: %s; still serving: %s\n    %s\n    failure report: %s (log: %s)",
            state.job.label,
            why,
            ", ".join(public_units(self.repository, self.loaded)) or "nothing",
            last,
            report,
            log_path,
        )
