"""Helpers for the reliability tests: small repositories linked to the exported models, and a
bounded background load that records every request's outcome."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import PIPELINE_REPOSITORY

# `embed`'s one step is the fused model, which reads the tokenizer's and encoder's files
MINIMAL = ("tokenizer", "encoder_fp32", "fused_fp32", "embed")


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
    protocol: str = "grpc"
    """grpc or http: raw tritonclient calls; "retrying-grpc": the project's EmbeddingClient
    (variant from ``model``), which retries transient errors within ``timeout_s``."""
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(self.workers)
        ]
        self.t0 = time.monotonic()

    def _caller(self) -> tuple[Any, Callable[[str], object]]:
        if self.protocol == "retrying-grpc":
            from tritonforge.client.sync import EmbeddingClient

            variant = self.model.removeprefix("embed").removeprefix("_") or "fp32"
            embedder = EmbeddingClient(
                self.url, "grpc", variant=variant, timeout_s=self.timeout_s, max_attempts=50,
                deadline_s=self.timeout_s,
            )  # fmt: skip
            return embedder, lambda text: embedder.embed([text])
        if self.protocol == "http":
            http = httpclient.InferenceServerClient(self.url, network_timeout=self.timeout_s)

            def call_http(text: str) -> object:
                tensor = httpclient.InferInput("text", [1, 1], "BYTES")
                tensor.set_data_from_numpy(np.array([[text.encode()]], dtype=np.object_))
                return http.infer(self.model, [tensor])

            return http, call_http
        grpc = grpcclient.InferenceServerClient(self.url)
        return grpc, lambda text: grpc.infer(
            self.model, text_inputs([text]), client_timeout=self.timeout_s
        )

    def _run(self, worker: int) -> None:
        client, call = self._caller()
        n = 0
        while not self._stop.is_set() and time.monotonic() - self.t0 < self.max_duration_s:
            n += 1
            start = time.monotonic()
            error = ""
            try:
                call(f"worker {worker} request {n}: the quick brown fox")
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


def gzip_bomb(inflated_bytes: int) -> bytes:
    """A valid gzip stream of ``inflated_bytes`` zero bytes (a multiple of 1 MiB), built without
    inflating anything: one fully flushed deflate chunk per MiB, repeated (~1 KB each)."""
    mib = bytes(1 << 20)
    deflate = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    first = deflate.compress(mib) + deflate.flush(zlib.Z_FULL_FLUSH)
    repeated = deflate.compress(mib) + deflate.flush(zlib.Z_FULL_FLUSH)
    count = inflated_bytes >> 20
    crc = 0
    for _ in range(count):
        crc = zlib.crc32(mib, crc)
    final_empty_block = b"\x03\x00"
    trailer = struct.pack("<II", crc, inflated_bytes & 0xFFFFFFFF)
    return first + repeated * (count - 1) + final_empty_block + trailer


LISTENING = re.compile(r"==> listening: HTTP \S+:(\d+) gRPC \S+:(\d+) metrics \S+:(\d+)")


@dataclass
class Launcher:
    """``python -m tritonforge.runtime serve`` in a subprocess, its output collected. Its ports
    are the ones it reports having bound (``==> listening: ...``; asked for port 0, it binds
    any free one and holds it), so no other process can take one between picking and binding."""

    proc: subprocess.Popen[str]
    requested: tuple[int, int, int] = (0, 0, 0)
    lines: list[str] = field(default_factory=list)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def ports(self, timeout_s: float = 120.0) -> tuple[int, int, int]:
        """(HTTP, gRPC, metrics) as bound; waits for the launcher to report them."""
        if all(self.requested):
            return self.requested
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = next((m for ln in self.lines if (m := LISTENING.search(ln))), None)
            if found:
                http, grpc, metrics = (int(g) for g in found.groups())
                return http, grpc, metrics
            assert self.proc.poll() is None, self.output
            time.sleep(0.1)
        raise AssertionError(f"no ports reported after {timeout_s} s:\n{self.output}")

    @property
    def http_port(self) -> int:
        return self.ports()[0]

    @property
    def grpc_port(self) -> int:
        return self.ports()[1]

    @property
    def metrics_port(self) -> int:
        return self.ports()[2]

    def health_url(self, timeout_s: float = 120.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            url = next((ln.split()[3] for ln in self.lines if "pipeline health:" in ln), "")
            if url:
                return url
            assert self.proc.poll() is None, self.output
            time.sleep(0.2)
        raise AssertionError(f"no health endpoint after {timeout_s} s:\n{self.output}")

    def stop(self) -> None:
        """SIGTERM (the launcher stops its server), SIGKILL if it does not exit."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def launch(
    repo: Path,
    *args: str,
    env: dict[str, str] | None = None,
    ports: tuple[int, int, int] | None = None,
) -> Launcher:
    """Start ``serve`` on ``ports`` (default 0: any free ones, bound and held by the launcher
    itself; before, ports picked free here and released could be taken before ``serve`` bound
    them: "address already in use")."""
    from tests.conftest import PROJECT_ROOT

    http_port, grpc_port, metrics_port = ports or (0, 0, 0)
    command = [
        sys.executable, "-m", "tritonforge.runtime", "serve", "--quiet", "--model-repository", str(repo),
        "--http-port", str(http_port), "--grpc-port", str(grpc_port),
        "--metrics-port", str(metrics_port), "--health-port", "0", *args,
    ]  # fmt: skip
    proc = subprocess.Popen(
        command,
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
    )
    launcher = Launcher(proc, (http_port, grpc_port, metrics_port))
    assert proc.stdout is not None
    threading.Thread(
        target=lambda: launcher.lines.extend(iter(proc.stdout.readline, "")),  # type: ignore[union-attr]
        daemon=True,
    ).start()
    return launcher


def health(url: str) -> tuple[int, dict[str, object]]:
    """(status, JSON) of the pipeline health endpoint; (0, {}) when it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status), json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return int(e.code), json.loads(e.read() or b"{}")
    except OSError:
        return 0, {}
