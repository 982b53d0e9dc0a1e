"""The ``tritonforge`` command: every subcommand reaches its module, one ``--log-level``."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT
from tritonforge import cli


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tritonforge", *args],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_help_lists_every_subcommand() -> None:
    done = run("--help")
    assert done.returncode == 0
    for name in cli.COMMANDS:
        assert name in done.stdout


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_subcommand_module_has_a_main(name: str) -> None:
    assert callable(cli.COMMANDS[name].main())


def test_subcommand_arguments_reach_the_module() -> None:
    done = run("lint", "--model-repository", "no-such-repository")
    assert done.returncode == 1 and "no-such-repository" in done.stderr
    assert run("serve", "--help").stdout.startswith("usage: python -m tritonforge.runtime serve")


def test_log_level_applies_to_the_project_loggers_only(
    console_logging: Callable[[str], None],
) -> None:
    setup_logging = console_logging
    setup_logging("debug")
    assert logging.getLogger("tritonforge.client.retry").isEnabledFor(logging.DEBUG)
    setup_logging("warning")
    assert not logging.getLogger("tritonforge.runtime.tracing").isEnabledFor(logging.INFO)
    setup_logging("info")
    assert logging.getLogger("tritonforge.export.pipeline").isEnabledFor(logging.INFO)
    assert not logging.getLogger("onnxruntime").isEnabledFor(logging.INFO)
    with pytest.raises(ValueError, match="log level"):
        setup_logging("loud")


def test_export_without_a_spec_runs_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    class Fake(cli.Command):
        def main(self):  # type: ignore[no-untyped-def,override]
            return lambda argv: calls.append(list(argv)) or 0

    monkeypatch.setitem(cli.COMMANDS, "export", Fake("tritonforge.export.cli", ""))
    assert cli.run("export", ["--model-repository", "r"]) == 0
    assert calls == [[*spec, "--model-repository", "r"] for spec in cli.DEFAULT_EXPORTS]
    calls.clear()
    assert cli.run("export", ["minilm", "--force"]) == 0
    assert calls == [["minilm", "--force"]]
    calls.clear()
    byo = ["--from-pretrained", "ckpt", "--task", "classification", "--name", "reviews"]
    assert cli.run("export", list(byo)) == 0
    assert calls == [byo]  # a user's checkpoint, not the defaults


def test_serve_exports_an_incomplete_repository_first(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[tuple[str, list[str]]] = []

    class Fake(cli.Command):
        def main(self):  # type: ignore[no-untyped-def,override]
            return lambda argv: calls.append((self.module, list(argv))) or 0

    for name in ("export", "serve"):
        command = cli.COMMANDS[name]
        monkeypatch.setitem(cli.COMMANDS, name, Fake(command.module, "", command.prefix))
    empty = tmp_path / "repo"
    empty.mkdir()  # a fresh clone's repository: no encoders -> the lint finds problems
    (empty / "embed").mkdir()
    (empty / "embed" / "config.pbtxt").write_text('name: "embed"\nplatform: "ensemble"\n')
    assert cli.run("serve", ["--model-repository", str(empty)]) == 0
    export_module = cli.COMMANDS["export"].module
    assert calls[0] == (export_module, [*cli.DEFAULT_EXPORTS[0], "--model-repository", str(empty)])
    assert calls[-1][1] == ["serve", "--model-repository", str(empty)]
    calls.clear()
    assert cli.run("serve", ["--help", "--model-repository", str(empty)]) == 0
    assert [c[1][0] for c in calls] == ["serve"]  # --help never starts an export
    calls.clear()
    assert cli.run("serve", ["--no-export", "--model-repository", str(empty)]) == 0
    assert [c[1][0] for c in calls] == ["serve"]
