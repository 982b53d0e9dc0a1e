"""Progress lines go through :mod:`logging`: ``--log-level warning`` (or
``$TRITONFORGE_LOG_LEVEL``) silences them, errors still print, results stay on stdout."""

from __future__ import annotations

import ast
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT
from tritonforge.logs import LOG_LEVEL_ENV

PACKAGES = ("client", "deploy", "export", "loadtest", "runtime", "tritonforge")
# What these print is the command's result (the demo's answers), not progress.
RESULT_MODULES = {"runtime/cli/demo.py"}


def tritonforge(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tritonforge", *args],
        cwd=PROJECT_ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_progress_lines_print_at_info_and_a_quiet_level_silences_them(tmp_path: Path) -> None:
    repo = ["export", "clean", "--model-repository", str(tmp_path)]
    shown = tritonforge(*repo)
    assert shown.returncode == 0, shown.stderr
    # the same text as before, bare (no time/level prefix at info)
    assert shown.stderr == "==> [export clean] removed 0 item(s): -\n"
    quiet = tritonforge("--log-level", "warning", *repo)
    assert quiet.returncode == 0 and quiet.stdout == quiet.stderr == ""
    # a module run on its own (make runs some that way) follows $TRITONFORGE_LOG_LEVEL
    direct = subprocess.run(
        [sys.executable, "-m", "tritonforge.export", "clean", "--model-repository", str(tmp_path)],
        cwd=PROJECT_ROOT,
        env={**os.environ, LOG_LEVEL_ENV: "warning"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert direct.returncode == 0 and direct.stderr == ""


def test_errors_still_print_at_a_quiet_level(tmp_path: Path) -> None:
    (tmp_path / "embed").mkdir()
    (tmp_path / "embed" / "config.pbtxt").write_text('name: "embed"\nplatform: "ensemble"\n')
    done = tritonforge(
        "--log-level", "error", "serve", "--no-export", "--model-repository", str(tmp_path)
    )
    assert done.returncode == 2
    assert "error: not starting: " in done.stderr and "==>" not in done.stderr


def test_debug_shows_time_level_and_logger(tmp_path: Path) -> None:
    done = tritonforge(
        "--log-level", "debug", "export", "clean", "--model-repository", str(tmp_path)
    )
    assert " INFO tritonforge.export.cli: ==> [export clean]" in done.stderr


def test_a_bad_log_level_in_the_environment_is_one_line_naming_it() -> None:
    done = tritonforge("lint", env={LOG_LEVEL_ENV: "loud"})
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: ${LOG_LEVEL_ENV} must be one of debug, info, warning, error, got 'loud'"
    ]


def test_setup_logging_levels_and_format(console_logging: Callable[[str], None]) -> None:
    console_logging("warning")
    assert not logging.getLogger("tritonforge.loadtest.bench").isEnabledFor(logging.INFO)
    assert logging.getLogger("tritonforge.runtime.cli.main").isEnabledFor(logging.ERROR)
    console_logging("info")
    formatter = logging.getLogger().handlers[0].formatter
    assert formatter is not None
    info = logging.LogRecord("tritonforge.x", logging.INFO, __file__, 1, "==> ready", None, None)
    error = logging.LogRecord("tritonforge.x", logging.ERROR, __file__, 1, "boom %s", ("!",), None)
    assert formatter.format(info) == "==> ready"
    assert formatter.format(error) == "error: boom !"


def _progress_prints(path: Path) -> list[int]:
    """Lines of ``print("==> ...")`` calls (a progress line that bypasses logging)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "print"):
            continue
        first = node.args[0] if node.args else None
        if isinstance(first, ast.JoinedStr) and first.values:
            first = first.values[0]
        if isinstance(first, ast.Constant) and str(first.value).lstrip(" ").startswith("==>"):
            lines.append(node.lineno)
    return lines


def test_no_progress_line_bypasses_logging() -> None:
    found = {
        str(path.relative_to(PROJECT_ROOT)): lines
        for package in PACKAGES
        for path in sorted((PROJECT_ROOT / package).rglob("*.py"))
        if str(path.relative_to(PROJECT_ROOT)) not in RESULT_MODULES
        and (lines := _progress_prints(path))
    }
    assert not found, f"print('==> ...') instead of a logger's info: {found}"


@pytest.mark.parametrize("path", sorted(RESULT_MODULES))
def test_the_result_modules_exist(path: str) -> None:
    assert (PROJECT_ROOT / path).is_file()  # the exemption above names a real file
