"""The ``tritonforge`` command: every subcommand reaches its module, one ``--log-level``."""

from __future__ import annotations

import itertools
import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT
from tritonforge import cli
from tritonforge.runtime.cli.staged import ExportJob


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
    assert not logging.getLogger("tritonforge.runtime.launcher.tracing").isEnabledFor(logging.INFO)
    setup_logging("info")
    assert logging.getLogger("tritonforge.export.encoder").isEnabledFor(logging.INFO)
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
    assert calls == [[*spec, "--model-repository", "r"] for spec in cli.default_exports()]
    calls.clear()
    assert cli.run("export", ["minilm", "--force"]) == 0
    assert calls == [["minilm", "--force"]]
    calls.clear()
    byo = ["--from-pretrained", "ckpt", "--task", "classification", "--name", "reviews"]
    assert cli.run("export", list(byo)) == 0
    assert calls == [byo]  # a user's checkpoint, not the defaults
    calls.clear()
    gguf = ["--gguf", "m.gguf", "--task", "generation", "--name", "mine"]
    assert cli.run("export", list(gguf)) == 0
    assert calls == [gguf]  # a user's GGUF decoder, not the defaults
    calls.clear()
    late = ["--model-repository", "r", "--force", "minilm", "--version", "2"]
    assert cli.run("export", list(late)) == 0
    assert calls == [late]  # the spec after the options: still that spec, not the defaults


def test_export_options_go_before_or_after_the_spec() -> None:
    from tritonforge.export.cli import names_an_export, parse_args

    for argv in (
        ["--model-repository", "r", "minilm"],
        ["--model-repository", "r", "minilm", "--version", "2"],
        ["--force", "minilm", "--format", "onnx", "--model-repository", "r"],
        ["minilm", "--model-repository", "r"],
    ):
        args = parse_args(argv)
        assert (args.spec, str(args.model_repository)) == ("minilm", "r"), argv
        assert names_an_export(argv)
    assert not names_an_export(["--model-repository", "r", "--force"])


def test_serve_and_demo_export_every_default_in_the_background(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Nothing is exported before the server starts: serve/demo get one --background-export
    per default export (runtime.cli.staged), unless --no-export or the user's own."""
    calls: list[tuple[str, list[str]]] = []

    class Fake(cli.Command):
        def main(self):  # type: ignore[no-untyped-def,override]
            return lambda argv: calls.append((self.module, list(argv))) or 0

    monkeypatch.setattr("tritonforge.model_packages.require", lambda install_missing: None)
    for name in ("export", "serve", "demo"):
        command = cli.COMMANDS[name]
        monkeypatch.setitem(cli.COMMANDS, name, Fake(command.module, "", command.prefix))
    empty = tmp_path / "repo"
    empty.mkdir()  # a fresh clone's repository
    for name in ("serve", "demo"):
        assert cli.run(name, ["--model-repository", str(empty)]) == 0
        ((module, argv),) = calls
        assert module == cli.COMMANDS[name].module
        assert argv[:3] == [name, "--model-repository", str(empty)]
        jobs = [v for k, v in itertools.pairwise(argv) if k == "--background-export"]
        repo_args = ["--model-repository", str(empty)]
        assert [ExportJob.parse(j).argv for j in jobs] == [
            (*spec, *repo_args) for spec in cli.default_exports()
        ]
        calls.clear()
    assert cli.run("serve", ["--help", "--model-repository", str(empty)]) == 0
    assert calls.pop()[1] == ["serve", "--help", "--model-repository", str(empty)]
    assert cli.run("serve", ["--no-export", "--model-repository", str(empty)]) == 0
    assert calls.pop()[1] == ["serve", "--model-repository", str(empty)]
    mine = ["--background-export", "minilm"]
    assert cli.run("serve", list(mine)) == 0
    assert calls.pop()[1] == ["serve", *mine]  # the user's jobs, not the defaults
