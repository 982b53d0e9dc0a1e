"""The baseline services a bench loads (FastAPI apps in their own process), started and stopped
around the run."""

from __future__ import annotations

import argparse
import contextlib
import logging
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from tritonforge.loadtest.bench.cells import task_bench
from tritonforge.loadtest.errors import LoadtestError
from tritonforge.pipelines import Pipeline
from tritonforge.runtime.launcher.settings import free_port

log = logging.getLogger(__name__)


class ServiceNotReadyError(LoadtestError):
    """A baseline service did not answer ``/health`` in time."""


def _wait_http(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as response:
            if response.status == 200:
                return
        time.sleep(0.5)
    raise ServiceNotReadyError(
        f"{url} did not answer within {timeout_s:.0f} s: see the service's output above"
    )


@contextlib.contextmanager
def baseline_service(
    module: str, ready_timeout_s: float = 120, args: Sequence[str] = ()
) -> Iterator[str]:
    """A baseline app (``python -m MODULE --host 127.0.0.1 --port P [args]``) in its own process,
    ready when ``/health`` answers 200; yields ``127.0.0.1:P``; terminated on exit. It runs in
    the caller's working directory, so relative paths in ``args`` mean what they mean here."""
    port = free_port()
    command = [sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(port), *args]
    proc = subprocess.Popen(command)
    try:
        _wait_http(f"http://127.0.0.1:{port}/health", ready_timeout_s)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def fastapi_service(model_repository: Path) -> Iterator[str]:
    """The embedding baseline (one uvicorn worker) with ``model_repository``'s served tokenizer;
    yields its base URL."""
    module, repository = "tritonforge.loadtest.anchors.fastapi.embed", str(model_repository)
    with baseline_service(module, args=["--model-repository", repository]) as address:
        yield f"http://{address}"


def start_predict_service(
    stack: contextlib.ExitStack, args: argparse.Namespace, pipeline: Pipeline
) -> str:
    """The FastAPI /predict baseline of ``pipeline`` (its verified checkpoint); "" when none."""
    cell = task_bench(pipeline.task)
    if cell is None:
        return ""
    baseline, why = cell.baseline_for(args.model_repository, pipeline, args.classify_checkpoint)
    if baseline is None:
        log.warning("   (no FastAPI /predict baseline for %r: %s)", pipeline.name, why)
        return ""
    log.info("==> starting FastAPI /predict (PyTorch eager) for %r", pipeline.name)
    module, service_args = cell.FASTAPI_MODULE, baseline.service_args()
    address = stack.enter_context(baseline_service(module, args=service_args))
    return f"http://{address}"
