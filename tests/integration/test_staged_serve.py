"""``tritonforge serve --background-export``: each pipeline serves as soon as its export is done.

A temporary repository holds one exported pipeline (the tiny DistilBERT embedder); ``serve``
(the real command, in its own process) starts Triton with it and exports a second pipeline in the
background. The test freezes that export process (SIGSTOP) to look at the server while the second
pipeline is still being built: the first answers, the second is not ready and the pipeline health
port lists it as building; resumed, the export finishes and the second comes up. A background
export that fails leaves the first serving and prints the failure with its report's path.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import PROJECT_ROOT
from tritonforge.pipelines import from_repository
from tritonforge.runtime.launcher.settings import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

START_TIMEOUT_S = 300.0  # generous: 2 shared cores, a Triton start and a torch import or two
TEXTS = ["The service answered every request in time.", "bad"]


@pytest.fixture(scope="module")
def first_repository(
    tmp_path_factory: pytest.TempPathFactory, byo_checkpoints: dict[str, tuple[Path, str]]
) -> Path:
    """The embedder alone, exported (fp32 ONNX only: the quickest export)."""
    from tritonforge.export.encoder import Options, export_pipeline
    from tritonforge.export.specs.from_pretrained import pipeline_from_pretrained

    repo = tmp_path_factory.mktemp("staged") / "model_repository"
    directory, task = byo_checkpoints["distil"]
    spec = pipeline_from_pretrained(directory, task, "distil", max_length=64)
    export_pipeline(spec, Options(repo=repo, formats=("onnx",)), progress=lambda _: None)
    return repo


@dataclass
class Serve:
    """One ``tritonforge serve`` process and its addresses."""

    process: subprocess.Popen[bytes]
    output: Path
    http_url: str
    grpc_url: str
    health_url: str

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def wait_for(
        self, what: str, check: Callable[[], Any], timeout_s: float = START_TIMEOUT_S
    ) -> Any:
        """Poll ``check`` until it returns something truthy; fail with the output otherwise."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(
                    f"serve exited ({self.process.returncode}) before {what}:\n{self.text()}"
                )
            got = check()
            if got:
                return got
            time.sleep(0.1)
        pytest.fail(f"no {what} after {timeout_s:.0f} s; serve's output:\n{self.text()[-6000:]}")

    def health(self) -> tuple[int, dict[str, Any]] | None:
        try:
            with urllib.request.urlopen(self.health_url, timeout=5) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())
        except OSError:
            return None

    def export_process(self) -> psutil.Process | None:
        """The background ``tritonforge export`` process, once it runs."""
        try:
            children = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return None
        for child in children:
            try:
                command = child.cmdline()
                if command[1:3] == ["-m", "tritonforge"] and "export" in command:
                    return child
            except psutil.NoSuchProcess:
                continue
        return None


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Serve]]:
    """Factory: ``serve(repo, *background_exports)`` starts ``tritonforge serve``; stopped with
    SIGINT after the test (it must exit 0: a clean shutdown, background export interrupted)."""
    started: list[Serve] = []

    def start(repo: Path, *jobs: str) -> Serve:
        http, grpc, metrics, health = (free_port() for _ in range(4))
        output = tmp_path / f"serve-{len(started)}.log"
        argv = [sys.executable, "-m", "tritonforge", "serve", "--model-repository", str(repo)]
        argv += ["--http-port", str(http), "--grpc-port", str(grpc)]
        argv += ["--metrics-port", str(metrics), "--health-port", str(health)]
        argv += ["--canary-interval-s", "1", "--quiet"]
        for job in jobs:
            argv += ["--background-export", job]
        with open(output, "wb") as out:
            process = subprocess.Popen(
                argv, cwd=PROJECT_ROOT, stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip
        s = Serve(
            process, output, f"127.0.0.1:{http}", f"127.0.0.1:{grpc}",
            f"http://127.0.0.1:{health}/health/pipeline",
        )  # fmt: skip
        started.append(s)
        return s

    yield start
    for s in started:
        if s.process.poll() is None:
            frozen = s.export_process()
            if frozen is not None:
                frozen.resume()
            s.process.send_signal(signal.SIGINT)
            try:
                s.process.wait(120)
            except subprocess.TimeoutExpired:
                s.process.kill()
                s.process.wait()
                pytest.fail(f"serve did not stop on SIGINT:\n{s.text()[-4000:]}")
            assert s.process.returncode == 0, s.text()[-4000:]


def infer(url: str, protocol: str, model: str, output: str) -> np.ndarray:
    data = np.array([t.encode() for t in TEXTS], dtype=np.object_).reshape(-1, 1)
    lib: Any = httpclient if protocol == "http" else grpcclient
    with lib.InferenceServerClient(url) as client:
        tensor = lib.InferInput("text", list(data.shape), "BYTES")
        tensor.set_data_from_numpy(data)
        result: np.ndarray = client.infer(model, [tensor]).as_numpy(output)
        return result


def model_ready(url: str, model: str) -> bool:
    with httpclient.InferenceServerClient(url) as client:
        return bool(client.is_model_ready(model))


def embed_answers(s: Serve, repo: Path) -> None:
    pipeline = from_repository(repo)["distil"]
    got = infer(s.http_url, "http", pipeline.model("fp32"), pipeline.outputs[0].name)
    assert got.shape == (len(TEXTS), pipeline.dim) and np.isfinite(got).all()


def test_the_first_pipeline_serves_while_the_second_is_built(
    first_repository: Path,
    byo_checkpoints: dict[str, tuple[Path, str]],
    serve: Callable[..., Serve],
    tmp_path: Path,
) -> None:
    import shutil

    repo = tmp_path / "model_repository"
    shutil.copytree(first_repository, repo)
    directory, task = byo_checkpoints["sentiment"]
    job = (
        f"--from-pretrained {directory} --task {task} --name tinycls --format onnx --max-length 64"
    )
    s = serve(repo, job)
    exporter = s.wait_for("background export process", s.export_process)
    exporter.suspend()  # hold the second pipeline in "building" while we look
    try:
        s.wait_for("server ready", lambda: "==> ready:" in s.text())
        embed_answers(s, repo)  # the first pipeline answers at once
        _, body = s.wait_for(
            "healthy pipeline health", lambda: (h := s.health()) and h[0] == 200 and h
        )
        assert body["building"] == {"tinycls": body["building"]["tinycls"]}
        assert body["building"]["tinycls"].startswith("exporting")
        assert body["export_failures"] == {}
        first = from_repository(repo)["distil"]
        assert body["models"] == {m: "ok" for m in first.public_models}
        assert not (repo / "tinycls").exists()  # nothing of it in the repository yet
        assert "pipeline distil up after" in s.text()
    finally:
        exporter.resume()
    s.wait_for("the second pipeline up", lambda: "pipeline tinycls up after" in s.text())
    assert model_ready(s.http_url, "tinycls") and model_ready(s.http_url, "tinycls_bls")
    classify = from_repository(repo)["tinycls"]
    labels = infer(s.grpc_url, "grpc", classify.model("fp32"), "label")
    assert {row[0].decode() for row in labels} <= set(classify.labels)
    embed_answers(s, repo)  # the first still answers
    status, body = s.wait_for(
        "both canaried", lambda: (h := s.health()) and "tinycls" in h[1]["models"] and h
    )
    assert status == 200 and body["building"] == {} and body["status"] == "ok", body
    first = from_repository(repo)["distil"]
    assert set(body["models"]) == {*first.public_models, *classify.public_models}


def test_a_failed_background_export_leaves_the_served_pipeline_serving(
    first_repository: Path,
    byo_checkpoints: dict[str, tuple[Path, str]],
    serve: Callable[..., Serve],
    tmp_path: Path,
) -> None:
    import shutil

    repo = tmp_path / "model_repository"
    shutil.copytree(first_repository, repo)
    # a checkpoint whose weights file is damaged: it inspects fine, the export fails loading it
    directory, task = byo_checkpoints["sentiment"]
    broken = tmp_path / "broken"
    shutil.copytree(directory, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    s = serve(repo, f"--from-pretrained {broken} --task {task} --name damaged")
    s.wait_for("the failure", lambda: "export damaged FAILED" in s.text())
    report = tmp_path / ".tritonforge" / "background-exports" / "damaged.failed.json"
    text = s.text()
    assert f"failure report: {report}" in text, text[-3000:]
    assert "still serving: distil" in text
    failure = json.loads(report.read_text())
    assert failure["error_lines"] and "rror" in failure["error_lines"][-1], failure
    assert failure["error_lines"][-1] in Path(failure["log"]).read_text()
    assert f"    {failure['error_lines'][-1].strip()}\n" in text  # the error, printed
    embed_answers(s, repo)
    _, body = s.wait_for("healthy pipeline health", lambda: (h := s.health()) and h[0] == 200 and h)
    assert body["building"] == {}
    assert str(report) in body["export_failures"]["damaged"]
    assert not any(p.name.startswith("damaged") for p in repo.iterdir())


def test_the_demo_shows_each_pipeline_as_it_comes_up(
    first_repository: Path, byo_checkpoints: dict[str, tuple[Path, str]], tmp_path: Path
) -> None:
    """``make run`` is ``tritonforge demo`` with the default exports in the background."""
    import shutil

    repo = tmp_path / "model_repository"
    shutil.copytree(first_repository, repo)
    directory, task = byo_checkpoints["sentiment"]
    job = (
        f"--from-pretrained {directory} --task {task} --name tinycls --format onnx --max-length 64"
    )
    ports = [str(free_port()) for _ in range(4)]
    done = subprocess.run(
        [sys.executable, "-m", "tritonforge", "demo", "--once", "--quiet",
         "--model-repository", str(repo), "--http-port", ports[0], "--grpc-port", ports[1],
         "--metrics-port", ports[2], "--health-port", ports[3], "--background-export", job],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    first = done.stdout.index("==> distil: embedded")
    assert "pipeline distil up after" in done.stderr
    assert "pipeline tinycls up after" in done.stderr
    second = done.stdout.index("==> tinycls: classified 3 sentences")
    assert first < second
    assert "tinycls_bls over gRPC" in done.stdout
