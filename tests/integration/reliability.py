"""Helpers for the reliability tests: small repositories linked to the exported models, and a
bounded background load that records every request's outcome."""

from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from tests.conftest import PIPELINE_REPOSITORY

MINIMAL = ("tokenizer", "encoder_fp32", "embed")


def linked_repository(
    target: Path, models: tuple[str, ...] = MINIMAL, copy: tuple[str, ...] = ()
) -> Path:
    """A repository in ``target`` whose models link to the exported ones; models in ``copy`` get a
    real directory (own config) with their existing versions linked, so tests can add versions."""
    target.mkdir(parents=True, exist_ok=True)
    for name in models:
        source = PIPELINE_REPOSITORY / name
        if name not in copy:
            os.symlink(source.resolve(), target / name)
            continue
        (target / name).mkdir()
        for entry in source.iterdir():
            if entry.is_dir() and entry.name.isdigit():
                os.symlink(entry.resolve(), target / name / entry.name)
            elif entry.is_file():
                shutil.copy2(entry, target / name / entry.name)
            else:
                os.symlink(entry.resolve(), target / name / entry.name)
    return target


def text_inputs(texts: list[str]) -> list[grpcclient.InferInput]:
    value = np.array([[t.encode()] for t in texts], dtype=np.object_)
    tensor = grpcclient.InferInput("text", list(value.shape), "BYTES")
    tensor.set_data_from_numpy(value)
    return [tensor]


@dataclass
class Outcome:
    started_s: float
    latency_s: float
    error: str = ""


@dataclass
class Load:
    """``workers`` threads sending one text at a time to ``model`` until stopped (bounded)."""

    url: str
    model: str
    workers: int = 2
    timeout_s: float = 10.0
    max_duration_s: float = 120.0
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(self.workers)
        ]
        self.t0 = time.monotonic()

    def _run(self, worker: int) -> None:
        client = grpcclient.InferenceServerClient(self.url)
        n = 0
        while not self._stop.is_set() and time.monotonic() - self.t0 < self.max_duration_s:
            n += 1
            start = time.monotonic()
            error = ""
            try:
                client.infer(
                    self.model,
                    text_inputs([f"worker {worker} request {n}: the quick brown fox"]),
                    client_timeout=self.timeout_s,
                )
            except Exception as e:  # record every failure, whatever its kind
                error = f"{type(e).__name__}: {e}"
                time.sleep(0.05)
            with self._lock:
                self.outcomes.append(Outcome(start - self.t0, time.monotonic() - start, error))
        client.close()

    def start(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> Load:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self.timeout_s + 5)
        return self

    def wait_for(self, count: int, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.outcomes) < count and time.monotonic() < deadline:
            time.sleep(0.05)

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.error]
