"""``make help`` lists every target (a target without a ``##`` description is hidden)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.conftest import PROJECT_ROOT

TARGET = re.compile(r"^([a-z][a-z0-9-]*):(?!=)", re.MULTILINE)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_help_lists_every_target() -> None:
    targets = set(TARGET.findall((PROJECT_ROOT / "Makefile").read_text()))
    assert {"help", "test", "gate", "perf"} <= targets
    done = subprocess.run(
        ["make", "--no-print-directory", "help"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    listed = {line.split("\t")[0] for line in done.stdout.splitlines() if line.strip()}
    assert targets == listed, f"hidden from make help: {sorted(targets - listed)}"
