"""A bad environment value is one line naming the variable, in the library and on every CLI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT
from tritonforge.client import ClientSettings, InvalidRequestError
from tritonforge.env import EnvironmentValueError, env_float, env_int
from tritonforge.runtime.errors import EmbeddedServerError


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
        ("TRITONFORGE_SLO_P95_MS", ["tritonforge", "loadtest"], 2),
        ("TRITONFORGE_DEMO_TIMEOUT_S", ["tritonforge", "demo", "--no-export"], 2),
        ("TRITONFORGE_BENCH_REPEATS", ["tritonforge", "bench"], 2),
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


# Every environment variable the packages read, and how a bad value of it is reported. A variable
# added to the code without a row here fails test_every_variable_the_packages_read_is_covered.
PACKAGES = ("client", "deploy", "export", "loadtest", "runtime", "tritonforge")
ENV_NAME = re.compile(r"""["']((?:TRITONFORGE|FASTAPI)_[A-Z0-9_]+)["']""")
# Any string is a valid value: a wrong address, path or key fails where it is used, naming it.
FREE_TEXT = {
    "TRITONFORGE_ADMIN_KEY",
    "TRITONFORGE_BENCH_URL",
    "TRITONFORGE_CACHE_DIR",  # a directory, or "off" (integrity.py checks ownership and mode)
    "TRITONFORGE_CLASSIFIER_DIR",  # a checkpoint directory (#11, on main)
    "TRITONFORGE_EXPORT_TARGET",  # a target name: export checks it against its targets, naming it
    "TRITONFORGE_GRPC_URL",
    "TRITONFORGE_HOST",
    "TRITONFORGE_LOADTEST_URL",
    "TRITONFORGE_METRICS_URL",
    "TRITONFORGE_OPENAI_API_KEY",  # the /v1 API key (any text)
    "TRITONFORGE_MODEL_REPOSITORY",
    "TRITONFORGE_PERF_ANALYZER_DIR",
    "TRITONFORGE_PIPELINE_NAME",  # a pipeline's name: checked against the discovered ones
    "TRITONFORGE_PYTHONPATH",  # set by the launcher for Triton's stub, not by users
    "TRITONFORGE_URL",
    "TRITONFORGE_VARIANT",  # checked against the discovered pipeline's variants
}


def _client() -> object:
    return ClientSettings()


def _runtime_cli() -> object:
    from tritonforge.runtime.cli.main import main

    return main(["lint", "--model-repository", "no-such-repository"])


def _server_settings() -> object:
    from tritonforge.runtime.launcher.settings import ServerSettings

    return ServerSettings(model_repository=Path("model_repository"))


def _front() -> object:
    from tritonforge.runtime.front.app import main

    return main(["--help"])


def _bench() -> object:
    from tritonforge.loadtest.bench.cli import main

    return main(["--help"])


def _loadtest() -> object:
    from tritonforge.loadtest.locust.run import main

    return main(["--help"])


def _locust_options() -> object:
    from tritonforge.loadtest.locust.options import check_environment

    return check_environment()


def _fastapi() -> object:
    from tritonforge.loadtest.anchors.fastapi.embed import main

    return main(["--help"])


def _trace() -> object:
    from tritonforge.runtime.launcher.tracing import trace_args

    return trace_args("localhost:4318" if os.environ.get("TRITONFORGE_TRACE_RATE") else None)


def _log_level() -> object:
    from tritonforge.logs import level_from_env

    return level_from_env()


def _cache() -> object:
    # the response cache (#12) is on main; on a branch without it the row skips
    cache = pytest.importorskip("tritonforge.runtime.launcher.cache")
    return cache.cache_args()


def _demo() -> object:
    import importlib

    import tritonforge.runtime.cli.demo as demo

    return importlib.reload(demo)


TYPED: dict[str, Callable[[], object]] = {
    "TRITONFORGE_TIMEOUT_S": _client,
    "TRITONFORGE_MAX_ATTEMPTS": _client,
    "TRITONFORGE_DEADLINE_S": _client,
    "TRITONFORGE_BATCH_SIZE": _client,
    "TRITONFORGE_PROTOCOL": _client,
    "TRITONFORGE_PIPELINE": _client,
    "TRITONFORGE_BREAKER_FAILURES": _client,
    "TRITONFORGE_BREAKER_WINDOW_S": _client,
    "TRITONFORGE_BREAKER_COOLDOWN_S": _client,
    "TRITONFORGE_HEALTH_PORT": _runtime_cli,
    "TRITONFORGE_HTTP_PORT": _server_settings,
    "TRITONFORGE_GRPC_PORT": _front,
    "TRITONFORGE_METRICS_PORT": _server_settings,
    "TRITONFORGE_SHM_LIMIT_BYTES": _server_settings,
    "TRITONFORGE_BENCH_DURATION_S": _bench,
    "TRITONFORGE_BENCH_REPEATS": _bench,
    "TRITONFORGE_LOADTEST_DURATION_S": _loadtest,
    "TRITONFORGE_TEXTS_PER_REQUEST": _locust_options,
    "TRITONFORGE_SLO_P95_MS": _locust_options,
    "TRITONFORGE_SLO_P99_MS": _locust_options,
    "TRITONFORGE_SLO_MIN_RPS": _locust_options,
    "TRITONFORGE_SLO_MAX_FAIL_RATIO": _locust_options,
    "TRITONFORGE_LOADTEST_REQUEST_TIMEOUT_S": _locust_options,
    "FASTAPI_PORT": _fastapi,
    "TRITONFORGE_TRACE_RATE": _trace,
    "TRITONFORGE_TRACE_OTLP": _trace,
    "TRITONFORGE_LOG_LEVEL": _log_level,
    "TRITONFORGE_DEMO_TIMEOUT_S": _demo,
    "TRITONFORGE_CACHE_BYTES": _cache,
}


def _read_by_the_packages() -> set[str]:
    names: set[str] = set()
    for package in PACKAGES:
        for path in (PROJECT_ROOT / package).rglob("*.py"):
            names |= set(ENV_NAME.findall(path.read_text()))
    return names


def test_every_variable_the_packages_read_is_covered() -> None:
    read = _read_by_the_packages()
    assert read >= {"TRITONFORGE_TIMEOUT_S", "TRITONFORGE_LOG_LEVEL", "FASTAPI_PORT"}
    assert read - FREE_TEXT - set(TYPED) == set(), "add a row to TYPED or FREE_TEXT"
    # (a TYPED row nothing reads fails test_a_bad_value_is_an_error_naming_the_variable)


@pytest.mark.parametrize("variable", sorted(TYPED))
def test_a_bad_value_is_an_error_naming_the_variable(
    variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, "abc")
    if variable == "TRITONFORGE_TRACE_OTLP":
        monkeypatch.setenv(variable, "no port here")
    with pytest.raises(Exception, match=re.escape(f"${variable} ")) as caught:
        TYPED[variable]()
    assert isinstance(
        caught.value, EnvironmentValueError | InvalidRequestError | EmbeddedServerError
    )
    assert "\n" not in str(caught.value)  # one line


def test_the_demo_module_reloads_cleanly_after_its_test(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITONFORGE_DEMO_TIMEOUT_S", raising=False)
    assert _demo().TIMEOUT_S == 60.0  # type: ignore[attr-defined]
