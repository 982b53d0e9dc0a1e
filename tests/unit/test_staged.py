"""runtime.cli.staged without a server: what is servable, load order, labels, a failing export."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import pytest

from tritonforge.runtime.cli.staged import (
    BackgroundExports,
    ExportJob,
    dependency_order,
    files_stamp,
    public_units,
    servable_models,
)
from tritonforge.runtime.errors import EmbeddedServerError
from tritonforge.runtime.launcher.command import triton_command
from tritonforge.runtime.launcher.lint import lint_by_model, lint_repository
from tritonforge.runtime.launcher.settings import ServerSettings
from tritonforge.runtime.serving import EmbeddedServer
from tritonforge.runtime.supervisor.health import Health, HealthEndpoint
from tritonforge.runtime.supervisor.supervisor import Supervisor

EMBED_PUBLIC = ["embed", "embed_int8", "embed_torchscript", "embed_bls"]


def test_a_complete_repository_is_servable_callees_first(embed_repo: Path) -> None:
    models, problems = servable_models(embed_repo)
    assert problems == {}
    assert sorted(models) == sorted(lint_by_model(embed_repo))
    for caller, callees in {
        "embed": ["tokenizer", "encoder_fp32"],
        "embed_bls": ["tokenizer", "encoder_fp32", "encoder_int8", "encoder_torchscript"],
    }.items():
        assert all(models.index(c) < models.index(caller) for c in callees), models


def test_a_missing_artifact_keeps_its_model_and_every_caller_unloaded(embed_repo: Path) -> None:
    (embed_repo / "encoder_int8" / "1" / "model.onnx").unlink()
    models, problems = servable_models(embed_repo)
    # the int8 ensemble's fused step runs encoder_int8's graph: it waits with it
    assert set(problems) == {"encoder_int8", "fused_int8", "embed_int8", "embed_bls"}
    assert "model.onnx is missing" in problems["encoder_int8"][0]
    assert "needs encoder_int8" in problems["embed_bls"][0]
    assert "needs encoder_int8" in problems["fused_int8"][0]
    assert {"tokenizer", "encoder_fp32", "fused_fp32", "embed", "embed_torchscript"} <= set(models)


def test_lint_by_model_attributes_each_problem(embed_repo: Path) -> None:
    (embed_repo / "encoder_int8" / "1" / "model.onnx").unlink()
    for a, b in [("loop_a", "loop_b"), ("loop_b", "loop_a")]:
        (embed_repo / a / "1").mkdir(parents=True)
        (embed_repo / a / "1" / "model.py").write_text("")
        (embed_repo / a / "config.pbtxt").write_text(
            f'name: "{a}"\nbackend: "python"\n'
            f'parameters {{ key: "next_model" value: {{ string_value: "{b}" }} }}\n'
        )
    by_model = lint_by_model(embed_repo)
    assert by_model["encoder_fp32"] == [] and by_model["embed"] == []
    assert any("model.onnx" in p for p in by_model["encoder_int8"])
    assert by_model["loop_a"] == by_model["loop_b"] == ["cycle: loop_a -> loop_b -> loop_a"]
    # the flat lint says the same, once each
    flat = lint_repository(embed_repo)
    assert sorted(flat) == sorted({p for ps in by_model.values() for p in ps})
    assert lint_by_model(embed_repo / "nope") == {
        "": [f"{embed_repo / 'nope'}: model repository does not exist"]
    }


def test_dependency_order_breaks_cycles_and_ignores_outsiders() -> None:
    order = dependency_order({"a": ["b", "x"], "b": ["a"], "c": ["b"]})
    assert sorted(order) == ["a", "b", "c"] and order.index("b") < order.index("c")


def test_public_units_are_pipelines_and_uncalled_models(embed_repo: Path) -> None:
    lone = embed_repo / "generate"
    (lone / "1").mkdir(parents=True)
    (lone / "1" / "model.py").write_text("")
    (lone / "config.pbtxt").write_text('name: "generate"\nbackend: "python"\n')
    models, _ = servable_models(embed_repo)
    units = public_units(embed_repo, models)
    assert sorted(units) == ["embed", "generate"]
    assert sorted(units["embed"]) == sorted(EMBED_PUBLIC) and units["generate"] == ["generate"]
    assert public_units(embed_repo, ["tokenizer", "encoder_fp32"]) == {}  # nothing public


@pytest.mark.parametrize(
    ("argv", "label"),
    [
        ("minilm --format all --quantize int8", "minilm"),
        ("--from-pretrained /ckpt/My-Model --task embedding --name reviews", "reviews"),
        ("--from-pretrained '/ckpt/my model' --task embedding", "my model"),
    ],
)
def test_job_label(argv: str, label: str) -> None:
    assert ExportJob.parse(argv).label == label


def test_a_staged_start_loads_exactly_the_listed_models(tmp_path: Path) -> None:
    def flags(**kw: object) -> list[str]:
        s = ServerSettings(model_repository=tmp_path, model_control_mode="explicit", **kw)  # type: ignore[arg-type]
        cmd = triton_command(s, Path("tritonserver"), tmp_path, tmp_path, "p")
        return [a for a in cmd if a.startswith("--load-model")]

    assert flags() == ["--load-model=*"]
    assert flags(load_all=False) == []
    assert flags(load_all=False, load_models=["a"]) == ["--load-model=a"]


def test_a_failed_background_export_writes_a_failure_report(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    fail = "import sys; print('==> [export x] start'); print('export failed: no checkpoint'); sys.exit(3)"
    server = EmbeddedServer(ServerSettings.ephemeral(repo))  # never started
    lines: list[str] = []
    try:
        jobs = [ExportJob(("tiny", "--force"))]
        background = BackgroundExports(
            server, jobs, export_command=[sys.executable, "-c", fail], echo=lines.append
        )
        assert background.building() == {"tiny": "queued"}
        assert background.start().wait(60)
    finally:
        server.stop()
    assert background.building() == {}
    failed = background.failed()
    assert list(failed) == ["tiny"] and "exit status 3" in failed["tiny"]
    report_path = tmp_path / ".tritonforge" / "background-exports" / "tiny.failed.json"
    assert str(report_path) in failed["tiny"]
    report = json.loads(report_path.read_text())
    assert report["error_lines"] == ["export failed: no checkpoint"]
    assert report["command"] == ["tritonforge", "export", "tiny", "--force"]
    assert "export failed: no checkpoint" in Path(report["log"]).read_text()
    assert lines == ["==> [export x] start", "export failed: no checkpoint"]


def test_health_reports_what_is_still_building(tmp_path: Path) -> None:
    class Builds:
        def building(self) -> dict[str, str]:
            return {"sentiment": "exporting for 3 s"}

        def failed(self) -> dict[str, str]:
            return {"smollm2": "export failed (report: r.json)"}

    server = EmbeddedServer(ServerSettings.ephemeral(tmp_path))  # not started: not ready
    endpoint = HealthEndpoint(server, "127.0.0.1", 0)
    try:
        endpoint.builds = Builds()
        body = endpoint.health().to_json()
    finally:
        endpoint.stop()
        server.stop()
    assert body["status"] == "unhealthy"
    assert body["building"] == {"sentiment": "exporting for 3 s"}
    assert body["export_failures"] == {"smollm2": "export failed (report: r.json)"}
    assert Health().to_json()["building"] == {}


def test_a_supervisor_with_nothing_loaded_yet_never_restarts(tmp_path: Path) -> None:
    """A staged start on a fresh clone serves no model for minutes: no canary, no restart."""
    loops = threading.Semaphore(0)
    restarts: list[str] = []

    class Idle(EmbeddedServer):
        """A running tritonserver (it never exits here) with nothing loaded."""

        @property
        def pid(self) -> int | None:
            return os.getpid()

        @property
        def returncode(self) -> int | None:
            return None

        def stub_pids(self) -> dict[str, int]:
            loops.release()  # once per supervisor loop
            return {}

        def restart(self, stop_timeout_s: float = 5.0) -> EmbeddedServer:
            restarts.append("restart")
            raise EmbeddedServerError("not in this test")

    server = Idle(ServerSettings.ephemeral(tmp_path, model_control_mode="explicit"))
    supervisor = Supervisor(server, models=[], canary_interval_s=0.0, poll_interval_s=0.001).start()
    try:
        for _ in range(50):
            assert loops.acquire(timeout=30)
    finally:
        supervisor.stop()
        server.stop()
    assert restarts == [] and supervisor.health().server_restarts == 0
    assert not supervisor.health().healthy  # nothing serves yet


def test_files_stamp_changes_when_an_export_replaces_a_version(embed_repo: Path) -> None:
    import os

    before = files_stamp(embed_repo / "encoder_fp32")
    assert before == files_stamp(embed_repo / "encoder_fp32")  # nothing changed: no reload
    staged = embed_repo.parent / "staged-1"
    staged.mkdir()
    (staged / "model.onnx").write_bytes(b"re-exported")
    os.utime(staged / "model.onnx", ns=(before[1] + 10**9, before[1] + 10**9))
    os.replace(embed_repo / "encoder_fp32" / "1", embed_repo.parent / "old")
    os.replace(staged, embed_repo / "encoder_fp32" / "1")
    assert files_stamp(embed_repo / "encoder_fp32") != before


def test_background_exports_need_explicit_model_control(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tritonforge.runtime.cli.main import main

    argv = ["serve", "--model-repository", str(tmp_path), "--background-export", "minilm"]
    assert main([*argv, "--model-control-mode", "none"]) == 1  # nothing started
    assert "--background-export needs --model-control-mode explicit" in caplog.text


def test_the_default_exports_run_fastest_first_the_classifier_training_one_last() -> None:
    """`make run` serves each pipeline as its export is done: embed (~1 min) first, rerank
    (seconds), the image classifier (~30 s), then generate (~2.5 min); classify last, as it trains the classifier first
    (docs/operations.md)."""
    from tritonforge.runtime.cli.serve_setup import background_exports

    args = background_exports(["--model-repository", "r"])
    jobs = [ExportJob.parse(a).label for a in args[1::2]]
    assert args[::2] == ["--background-export"] * len(jobs)
    assert jobs == ["minilm", "msmarco", "efficientnet_lite0", "smollm2", "sentiment"]


def test_stopping_the_background_exports_interrupts_the_running_one(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    server = EmbeddedServer(ServerSettings.ephemeral(repo))
    hold = "import time; time.sleep(300)"
    try:
        background = BackgroundExports(
            server,
            [ExportJob(("only",)), ExportJob(("next",))],
            export_command=[sys.executable, "-c", hold],
            echo=lambda line: None,
        )
        background.start()
        for _ in range(600):  # until the export runs
            if background._process is not None:
                break
            threading.Event().wait(0.05)
        running = background._process
        assert running is not None
        background.stop()
    finally:
        server.stop()
    assert running.poll() is not None and background.done.is_set()
    # the interrupted one no longer reads as exporting; the next one never started
    assert background.building() == {"next": "queued"}
