"""Progress bars with an ETA: export steps (ETA from the previous export's timings), and the
shared bar of bench and soak (a terminal only; log lines print above it)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from tritonforge.export.step_bar import StepBar, previous_timings
from tritonforge.progress import Bar


def test_previous_timings_come_from_the_last_export_report(tmp_path: Path) -> None:
    (tmp_path / "enc" / "1").mkdir(parents=True)
    (tmp_path / "enc" / "1" / "export_report.json").write_text(
        json.dumps({"timings_s": {"a": 1.5, "b": 8.5, "total": 10.0}})
    )
    assert previous_timings(tmp_path, ["missing/1/model.onnx", "enc/1/model.onnx"]) == {
        "a": 1.5,
        "b": 8.5,
    }
    assert previous_timings(tmp_path, ["missing/1/model.onnx"]) == {}


def test_bar_advances_by_the_expected_share_and_shows_the_eta(
    capsys: pytest.CaptureFixture[str], console_logging: Callable[[str], None]
) -> None:
    console_logging("info")  # the handler writes to this test's (captured) stderr
    bar = StepBar("minilm", {"a": 2.0, "b": 8.0}, enabled=True)
    bar.advance("a", 5.0)  # took longer than last time: the bar still moves by a's share
    assert bar.bar.n == pytest.approx(2.0)
    bar.advance("new step", 1.0)  # unknown steps do not move it
    assert bar.bar.n == pytest.approx(2.0)
    bar.write("==> a line above the bar")
    bar.advance("b", 8.0)
    bar.close()
    err = capsys.readouterr().err
    assert "==> a line above the bar\n" in err  # logged through tqdm.write, above the bar
    assert "left" in err and "100%" in err


def test_first_export_counts_steps_and_a_disabled_bar_logs_plainly(
    capsys: pytest.CaptureFixture[str], console_logging: Callable[[str], None]
) -> None:
    console_logging("info")
    bar = StepBar("minilm", {}, enabled=False)
    bar.advance("a", 1.0)
    bar.write("plain line")
    bar.close()
    assert capsys.readouterr().err == "plain line\n"  # no bar drawn, the log line is the record
    console_logging("warning")
    StepBar("minilm", {}, enabled=False).write("quiet line")
    assert capsys.readouterr().err == ""


def test_shared_bar_moves_to_a_total_and_restores_the_log_handlers(
    capsys: pytest.CaptureFixture[str], console_logging: Callable[[str], None]
) -> None:
    console_logging("info")
    handlers = list(logging.getLogger().handlers)
    with Bar("soak", 10, unit="s", enabled=True) as bar:
        assert logging.getLogger().handlers != handlers  # records print through tqdm.write
        bar.update_to(4)
        bar.update_to(3)  # never backwards
        assert bar.n == 4
        bar.update_to(25)  # capped at the total
        assert bar.n == 10
        logging.getLogger("tritonforge.loadtest.reliability.soak").info("a sample line")
    assert logging.getLogger().handlers == handlers
    err = capsys.readouterr().err
    assert "a sample line\n" in err and "soak: 100%" in err and "left" in err


def test_shared_bar_draws_nothing_off_a_terminal(
    capsys: pytest.CaptureFixture[str], console_logging: Callable[[str], None]
) -> None:
    console_logging("info")
    with Bar("bench", 3, unit="cells") as bar:  # stderr is captured: not a terminal
        assert not bar.enabled
        bar.update()
        logging.getLogger("tritonforge.loadtest.bench").info("==> round 1/1")
    assert capsys.readouterr().err == "==> round 1/1\n"


def test_steps_record_cpu_seconds_next_to_wall_seconds() -> None:
    """A step that computes shows its CPU seconds, one that waits shows (almost) none; both in
    the progress line, so a step that leaves a core idle is visible in the export's log. Run in a
    fresh interpreter: children of other tests reaped meanwhile would count here."""
    import subprocess
    import sys

    script = """
import json, time
from tritonforge.export.flow import Steps
lines = []
steps = Steps("x", lines.append)
with steps("busy"):
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
with steps("waiting"):
    time.sleep(0.2)
print(json.dumps({"cpu": steps.cpu_s, "wall": steps.timings, "lines": lines,
                  "total": steps.elapsed_cpu_s()}))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    out = json.loads(done.stdout.splitlines()[-1])
    cpu, wall = out["cpu"], out["wall"]
    assert cpu["busy"] >= 0.25  # 0.3 s spun; the accounting's resolution aside
    assert cpu["waiting"] < 0.1 <= wall["waiting"]
    assert any(line.strip().startswith("busy:") and "(CPU " in line for line in out["lines"])
    assert out["total"] >= cpu["busy"]
