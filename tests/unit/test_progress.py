"""Progress bars with an ETA: export steps (ETA from the previous export's timings)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tritonforge.export.progress import StepBar, previous_timings


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
    capsys: pytest.CaptureFixture[str],
) -> None:
    bar = StepBar("minilm", {"a": 2.0, "b": 8.0}, enabled=True)
    bar.advance("a", 5.0)  # took longer than last time: the bar still moves by a's share
    assert bar.bar.n == pytest.approx(2.0)
    bar.advance("new step", 1.0)  # unknown steps do not move it
    assert bar.bar.n == pytest.approx(2.0)
    bar.write("==> a line above the bar")
    bar.advance("b", 8.0)
    bar.close()
    err = capsys.readouterr()
    assert "==> a line above the bar" in err.out + err.err
    assert "left" in err.err and "100%" in err.err


def test_first_export_counts_steps_and_a_disabled_bar_prints_plainly(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bar = StepBar("minilm", {}, enabled=False)
    bar.advance("a", 1.0)
    bar.write("plain line")
    bar.close()
    assert capsys.readouterr().out == "plain line\n"
