"""runtime.launcher.cache: the response cache's tritonserver arguments and its environment variable."""

from __future__ import annotations

import pytest

from tritonforge.env import EnvironmentValueError
from tritonforge.runtime.launcher.cache import CACHE_ENV, cache_args


def test_size_and_the_wheels_cache_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CACHE_ENV, raising=False)
    args = cache_args(1024)
    assert "--cache-config=local,size=1024" in args
    directory = next(a for a in args if a.startswith("--cache-directory="))
    assert directory.endswith("caches")
    assert cache_args(0) == []


def test_environment_sets_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, "0")
    assert cache_args() == []
    monkeypatch.setenv(CACHE_ENV, "lots")
    with pytest.raises(EnvironmentValueError, match=CACHE_ENV):
        cache_args()
