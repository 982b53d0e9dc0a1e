"""A bad environment value is one line naming the variable, in the library and on every CLI."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import PROJECT_ROOT
from tritonforge.client import ClientSettings, InvalidRequestError
from tritonforge.env import EnvironmentValueError, env_float, env_int


def test_env_values_parse_default_and_fail_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TF_TEST_X", raising=False)
    assert env_int("TF_TEST_X", 3) == 3
    monkeypatch.setenv("TF_TEST_X", " 7 ")
    assert env_int("TF_TEST_X", 3) == 7 and env_float("TF_TEST_X", 1.0) == 7.0
    monkeypatch.setenv("TF_TEST_X", "abc")
    with pytest.raises(EnvironmentValueError, match=r"\$TF_TEST_X must be an integer, got 'abc'"):
        env_int("TF_TEST_X", 3)
    monkeypatch.setenv("TF_TEST_X", "-1")
    with pytest.raises(EnvironmentValueError, match=">= 0"):
        env_float("TF_TEST_X", 1.0, minimum=0)


def test_client_settings_reject_a_bad_timeout_as_a_client_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRITONFORGE_TIMEOUT_S", "abc")
    with pytest.raises(InvalidRequestError, match="TRITONFORGE_TIMEOUT_S"):
        ClientSettings()


@pytest.mark.parametrize(
    ("variable", "command", "status"),
    [
        ("TRITONFORGE_TIMEOUT_S", ["client", "health"], 1),
        ("TRITONFORGE_HEALTH_PORT", ["runtime", "lint"], 2),
        ("TRITONFORGE_HTTP_PORT", ["runtime", "serve", "--no-supervise"], 2),
    ],
)
def test_cli_prints_one_line_naming_the_variable(
    variable: str, command: list[str], status: int
) -> None:
    env = {**os.environ, variable: "abc"}
    proc = subprocess.run(
        [sys.executable, "-m", *command],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == status, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and variable in lines[0] and "Traceback" not in proc.stderr, lines
