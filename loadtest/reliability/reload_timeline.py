"""How long a killed stub's pipeline is down, phase by phase (issue #19: back within 10 s).

``python -m tritonforge.loadtest.reliability.reload_timeline --model-repository model_repository
--models generate,encoder_fp32,tokenizer,encoder_torchscript [--hog 2] [--out FILE]``

Serves the repository as ``serve`` and the chaos run do (explicit model control, the front, the
supervisor with the chaos run's intervals), then for each model in turn SIGSEGVs one of its stubs
and records, in seconds after the kill: the supervisor's detection (its recovery starts), each
reload it issues (start, end), its canaries, the end of the recovery, and for every public model
that calls the killed one (its pipeline, ensembles, BLS) when it answered OK again after its
last failed request (each probed back to back on its own connection). ``--hog N`` runs N
busy-loop processes meanwhile (the load of a flood on 2 cores).

``--phases`` instead times, in a fresh process per model, what one (re)load of the model costs
in-process: imports, the sha256 check (cold, and remembered: :mod:`tritonforge.integrity`), the
ONNX Runtime session / TorchScript load / tokenizer, and the warm-up.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tritonforge.loadtest.reliability.chaos.outcomes import OK, Outcome, is_down
from tritonforge.loadtest.reliability.chaos.probes import (
    Target,
    stream_once,
    targets,
    text_tensor,
)
from tritonforge.logs import run_main
from tritonforge.ort_options import session_options
from tritonforge.runtime.launcher.settings import ServerSettings
from tritonforge.runtime.serving import EmbeddedServer
from tritonforge.runtime.supervisor.model_graph import callees
from tritonforge.runtime.supervisor.supervisor import Supervisor


class TimedSupervisor(Supervisor):
    """The supervisor, recording when each step of a recovery happens (monotonic seconds)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.events: list[tuple[float, str, str]] = []

    def _event(self, what: str, detail: str = "") -> None:
        self.events.append((time.monotonic(), what, detail))

    def _recover(
        self, models: set[str], reason: str, dead: Sequence[str], sick: bool = False
    ) -> None:
        self._event("recover", reason)
        try:
            super()._recover(models, reason, dead, sick)
        finally:
            self._event("recovered", ",".join(sorted(models)))

    def _restart_server(self, reason: str) -> None:
        log_tail = self.server.log_text(last=60)  # the restart clears it
        self._event("server_restart", f"{reason}\n{log_tail}")
        super()._restart_server(reason)

    def _load(self, model: str) -> None:
        self._event("load", model)
        try:
            super()._load(model)
        finally:
            self._event("loaded", model)

    def canary(
        self, models: Iterable[str] | None = None, concurrent: bool = False
    ) -> dict[str, str]:
        # (positional ``concurrent`` only when set: the script also times older supervisors)
        ask = functools.partial(super().canary, concurrent=True) if concurrent else super().canary
        if models is None:  # the periodic rounds: not part of a recovery
            return ask(models)
        models = sorted(models)
        self._event("canary", ",".join(models))
        results = ask(models)
        self._event("canaried", json.dumps({m: v[:60] for m, v in results.items()}))
        return results


@dataclass
class Prober:
    """Back-to-back requests to one public model on a connection of its own."""

    url: str
    target: Target
    timeout_s: float = 20.0
    outcomes: list[Outcome] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def once(self) -> tuple[str, str]:
        import tritonclient.grpc as grpcclient

        tensor_of = text_tensor(grpcclient, self.target.input, "reload probe", False)
        if self.target.decoupled:
            return stream_once(self.url, self.target.model, [tensor_of], 1, self.timeout_s)
        client = grpcclient.InferenceServerClient(self.url)
        try:
            tensor = text_tensor(
                grpcclient, self.target.input, "reload probe", self.target.config.batched
            )
            client.infer(self.target.model, [tensor], client_timeout=self.timeout_s)
            return OK, ""
        except Exception as e:  # classified like the chaos run's
            from tritonforge.loadtest.reliability.chaos.outcomes import outcome_kind

            text = f"{type(e).__name__}: {e}"[:300]
            return outcome_kind(text), text
        finally:
            client.close()

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            kind, error = self.once()
            self.outcomes.append(
                Outcome(
                    self.target.pipeline, self.target.model, started, time.monotonic(), kind, error
                )
            )
            self.stop.wait(0.05)

    def back_after(self, kill_s: float) -> float | None:
        """Seconds from the kill to the first OK answer after the last failed request (0: none
        failed; None: not back)."""
        failed = [o.started_s for o in self.outcomes if o.started_s >= kill_s and is_down(o)]
        if not failed:
            return 0.0
        oks = [o.ended_s for o in self.outcomes if o.kind == OK and o.started_s > max(failed)]
        return min(oks) - kill_s if oks else None


@contextlib.contextmanager
def hog(processes: int) -> Iterator[None]:
    """``processes`` busy loops (the CPU load of a flood) while the block runs."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def kill_and_time(
    server: EmbeddedServer, supervisor: TimedSupervisor, model: str, give_up_s: float
) -> dict[str, Any]:
    """SIGSEGV one stub of ``model``; the timeline of its recovery (seconds after the kill)."""
    stubs = {i: pid for i, (pid, m) in server.stubs().items() if m == model}
    if not stubs:
        return {"model": model, "error": "no stub"}
    instance = sorted(stubs)[0]
    public = [
        t
        for t in targets(Path(server.settings.model_repository), supervisor.models)
        if model in callees(supervisor.calls, t.model)
    ]
    probers = [Prober(server.grpc_url, t) for t in public]
    threads = [threading.Thread(target=p.run, daemon=True) for p in probers]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # every prober answered once before the kill
    first = len(supervisor.events)
    load_before = os.getloadavg()[0]
    kill_s = time.monotonic()
    os.kill(stubs[instance], signal.SIGSEGV)
    deadline = kill_s + give_up_s
    while time.monotonic() < deadline:
        time.sleep(0.2)
        recovered = any(w == "recovered" for _, w, _ in supervisor.events[first:])
        back = [p.back_after(kill_s) for p in probers]
        settled = all(p.outcomes and p.outcomes[-1].kind == OK for p in probers)
        if recovered and settled and all(b is not None for b in back):
            break
    for p in probers:
        p.stop.set()
    for thread in threads:
        thread.join(timeout=30)
    events = [
        {"at_s": round(t - kill_s, 2), "what": w, "detail": d if w == "server_restart" else d[:200]}
        for t, w, d in supervisor.events[first:]
    ]
    backs = {p.target.model: p.back_after(kill_s) for p in probers}
    return {
        "model": model,
        "instance": instance,
        "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "events": events,
        "back_after_s": {m: None if b is None else round(b, 2) for m, b in backs.items()},
        "last_outcomes": {
            p.target.model: [
                (
                    round(o.started_s - kill_s, 2),
                    round(o.ended_s - kill_s, 2),
                    o.kind,
                    o.error[:120],
                )
                for o in p.outcomes[-4:]
            ]
            for p in probers
        },
        "failed_requests": {
            p.target.model: sum(1 for o in p.outcomes if o.started_s >= kill_s and is_down(o))
            for p in probers
        },
    }


def linked(repository: Path, models: Sequence[str], target: Path) -> Path:
    """A repository in ``target`` of only ``models``, each a symlink to its directory."""
    target.mkdir(parents=True, exist_ok=True)
    for name in models:
        os.symlink((repository / name).resolve(), target / name)
    return target


def timeline(
    repository: Path, models: Sequence[str], hog_processes: int, give_up_s: float
) -> list[dict[str, Any]]:
    settings = ServerSettings.ephemeral(repository, model_control_mode="explicit")
    server = EmbeddedServer(settings)
    server.start()
    supervisor: TimedSupervisor | None = None
    results = []
    try:
        server.wait_ready()
        supervisor = TimedSupervisor(server, canary_interval_s=1.0, poll_interval_s=0.2)
        supervisor.start()
        with hog(hog_processes):
            for model in models:
                time.sleep(3.0)  # settle: the previous recovery's stubs finish warming up
                result = kill_and_time(server, supervisor, model, give_up_s)
                result["hog_processes"] = hog_processes
                print(summary(result), flush=True)
                results.append(result)
    finally:
        if supervisor is not None:
            supervisor.stop()
        server.stop()
    return results


def summary(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"{result['model']}: {result['error']}"
    steps = ", ".join(
        f"{e['what']}{'(' + e['detail'] + ')' if e['what'] in ('load', 'loaded') else ''} "
        f"{e['at_s']:.2f}"
        for e in result["events"]
    )
    backs = ", ".join(
        f"{m} {b if b is None else f'{b:.2f}'}" for m, b in result["back_after_s"].items()
    )
    return (
        f"{result['model']} (load {result['load_average'][0]}->{result['load_average'][1]}, "
        f"hog {result.get('hog_processes', 0)}): {steps}; back: {backs}"
    )


# -- in-process phases ---------------------------------------------------------------------------
def _timed(phases: dict[str, float], name: str, fn: Callable[[], Any]) -> Any:
    started = time.perf_counter()
    value = fn()
    phases[name] = round(time.perf_counter() - started, 3)
    return value


def load_phases(repository: Path, model: str) -> dict[str, float]:
    """Seconds of each step of loading ``model`` as its stub does (run in a fresh process)."""
    import numpy as np

    from tritonforge.integrity import verify_sidecar
    from tritonforge.repository import load_model_config

    config = load_model_config(repository, model)
    version_dir = repository / model / "1"
    phases: dict[str, float] = {}
    backend = config.raw.get("backend", "")
    if backend == "onnxruntime":
        ort = _timed(phases, "imports", lambda: __import__("onnxruntime"))
        path = version_dir / (config.default_model_filename or "model.onnx")
        _timed(phases, "sha256", lambda: verify_sidecar(path, required=True, cache=False))
        verify_sidecar(path, required=True)  # remembered (the server's first load does this)
        _timed(phases, "sha256_remembered", lambda: verify_sidecar(path, required=True))
        options = session_options(ort, config.parameters)
        session = _timed(
            phases,
            "session",
            lambda: ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]),
        )
        feed = {i.name: np.ones((1, 16), np.int64) for i in session.get_inputs()}
        _timed(phases, "warmup", lambda: session.run(None, feed))
    elif backend == "pytorch":
        torch = _timed(phases, "imports", lambda: __import__("torch"))
        path = version_dir / (config.default_model_filename or "model.pt")
        _timed(phases, "sha256", lambda: verify_sidecar(path, required=True, cache=False))
        verify_sidecar(path, required=True)
        _timed(phases, "sha256_remembered", lambda: verify_sidecar(path, required=True))
        torch.set_num_threads(config.param("INTRA_OP_THREAD_COUNT", 1, int))
        module = _timed(
            phases, "jit_load", lambda: torch.jit.load(str(path), map_location="cpu").eval()
        )
        ones = [torch.ones((1, 16), dtype=torch.int64) for _ in config.inputs]

        def forward() -> Any:
            with torch.inference_mode(), torch.jit.optimized_execution(False):
                return module(*ones)

        _timed(phases, "warmup", forward)
        _timed(phases, "second_call", forward)
    elif config.param("decoder_file", "") and config.param("tokenizer_file", ""):
        from tritonforge.generate_engine import GenerateEngine

        _timed(phases, "imports", lambda: (__import__("onnxruntime"), __import__("tokenizers")))
        for key in ("decoder_file", "tokenizer_file", "generation_file"):
            path = version_dir / config.param(key, kind=str)
            _timed(
                phases,
                f"sha256 {path.name}",
                functools.partial(verify_sidecar, path, required=True, cache=False),
            )
            verify_sidecar(path, required=True)  # remembered, as after the server's first load
        engine = _timed(
            phases,
            "engine (remembered sha256 + session + tokenizer)",
            lambda: GenerateEngine(config, version_dir),
        )
        _timed(phases, "warmup", lambda: engine.warmup(config.param("warmup_prompt", "Hello")))
        engine.close()
    elif config.param("tokenizer_file", ""):
        from tritonforge.text import TextTokenizer

        path = version_dir / config.param("tokenizer_file", kind=str)
        _timed(phases, "sha256", lambda: verify_sidecar(path, required=True, cache=False))
        _timed(
            phases,
            "tokenizer",
            lambda: TextTokenizer(
                path,
                config.param("max_length", kind=int),
                1,
                outputs=[t.name for t in config.outputs],
            ),
        )
    return phases


def phases_in_fresh_processes(repository: Path, models: Sequence[str]) -> list[dict[str, Any]]:
    results = []
    for model in models:
        load_before = os.getloadavg()[0]
        started = time.perf_counter()
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                __spec__.name if __spec__ else __name__,
                "--model-repository",
                str(repository),
                "--phase-of",
                model,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        wall = time.perf_counter() - started
        phases = (
            json.loads(out.stdout.strip().splitlines()[-1])
            if out.returncode == 0
            else {"error": out.stderr[-500:]}
        )
        result = {
            "model": model,
            "phases_s": phases,
            "process_wall_s": round(wall, 2),
            "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        }
        print(json.dumps(result), flush=True)
        results.append(result)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tritonforge.loadtest.reliability.reload_timeline", description=__doc__
    )
    p.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    p.add_argument("--models", default="generate,encoder_fp32,tokenizer,encoder_torchscript")
    p.add_argument("--hog", type=int, default=0, help="busy-loop processes during the kills")
    p.add_argument("--give-up-s", type=float, default=90.0)
    p.add_argument(
        "--serve", default="", help="serve only these models (comma-separated; default: all)"
    )
    p.add_argument("--phases", action="store_true", help="time the load steps in-process instead")
    p.add_argument("--phase-of", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help="write the results as JSON")
    args = p.parse_args(argv)
    repository = args.model_repository.resolve()
    if args.phase_of:
        print(json.dumps(load_phases(repository, args.phase_of)))
        return 0
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if args.phases:
        with hog(args.hog):
            results = phases_in_fresh_processes(repository, models)
    else:
        with tempfile.TemporaryDirectory(prefix="tritonforge-timeline-") as tmp:
            served = [m.strip() for m in args.serve.split(",") if m.strip()]
            if served:
                repository = linked(repository, served, Path(tmp) / "repo")
            results = timeline(repository, models, args.hog, args.give_up_s)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
