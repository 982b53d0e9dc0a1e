"""The embedding peer bench's pure parts: Infinity's venv stamp, its offline server command,
cells, medians and the ours / Infinity ratios."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tritonforge.loadtest.anchors import infinity
from tritonforge.loadtest.bench.embed_infinity import (
    ANCHOR,
    OURS,
    Cell,
    cosines,
    format_table,
    median_cells,
    ratios,
    run_cell,
)


def test_the_venv_counts_as_installed_only_with_the_current_pins(tmp_path: Path) -> None:
    layout = infinity.Layout(tmp_path)
    assert not layout.installed()
    layout.python.parent.mkdir(parents=True)
    layout.python.write_text("")
    layout.stamp.write_text("infinity-emb==0.0.1\n")
    assert not layout.installed()  # a changed pin reinstalls
    layout.stamp.write_text("\n".join(infinity.PINS) + "\n")
    assert layout.installed()
    assert layout.venv == tmp_path / "infinity" / "venv"


def test_the_server_is_offline_on_loopback_serving_the_local_directory(tmp_path: Path) -> None:
    model = tmp_path / "model"
    cmd = infinity.server_command(infinity.Layout(tmp_path), model, 18321, 32)
    assert cmd[:2] == [str(tmp_path / "infinity" / "venv" / "bin" / "infinity_emb"), "v2"]
    args = dict(zip(cmd[2::2], cmd[3::2], strict=True))
    assert args["--model-id"] == str(model) and args["--served-model-name"] == "model"
    assert args["--host"] == "127.0.0.1" and args["--port"] == "18321"
    assert args["--device"] == "cpu"
    env = infinity.server_env(2)
    assert env["HF_HUB_OFFLINE"] == "1" and env["OMP_NUM_THREADS"] == "2"


def test_infinity_is_never_a_dependency_of_the_project() -> None:
    from importlib import metadata

    names = {
        r.split(";")[0].split("[")[0].split("=")[0].strip()
        for r in metadata.requires("tritonforge") or []
    }
    assert "infinity-emb" not in names


def test_a_cell_sends_every_request_once_from_each_thread() -> None:
    seen: list[str] = []

    def make() -> object:
        return lambda texts: seen.extend(texts)

    cell = run_cell("x", make, ["a", "b", "c"], concurrency=4, requests=10)
    assert cell.requests == 10 and sorted(seen) == sorted(["a", "b", "c"] * 3 + ["a"])
    assert cell.texts_s > 0 and cell.p99_ms >= cell.p50_ms


def test_a_failing_peer_fails_the_cell() -> None:
    def make() -> object:
        def embed(texts: object) -> None:
            raise OSError("connection refused")

        return embed

    with pytest.raises(OSError, match="refused"):
        run_cell("x", make, ["a"], concurrency=2, requests=4)


def test_medians_over_rounds_and_ratios_ours_over_infinity() -> None:
    rounds = [
        Cell(OURS, 1, 100, 100.0, 10.0, 20.0),
        Cell(OURS, 1, 100, 120.0, 8.0, 18.0),
        Cell(OURS, 1, 100, 110.0, 9.0, 30.0),
        Cell(ANCHOR, 1, 100, 50.0, 20.0, 40.0),
        Cell(OURS, 4, 100, 200.0, 20.0, 40.0),
    ]
    cells = median_cells(rounds)
    ours1 = next(c for c in cells if c.target == OURS and c.concurrency == 1)
    assert ours1.texts_s == 110.0 and ours1.p50_ms == 9.0 and ours1.p99_ms == 20.0
    r = {x["concurrency"]: x for x in ratios(cells)}
    assert r[1]["throughput_ratio"] == pytest.approx(2.2) and r[1]["p50_ratio"] == pytest.approx(
        0.45
    )
    assert r[4]["throughput_ratio"] is None  # no Infinity cell at 4
    assert "ours / Infinity @1: throughput 2.20x" in format_table(cells)


def test_cosines_are_scale_free() -> None:
    a = np.array([[1.0, 0.0], [1.0, 1.0]])
    assert cosines(a, 3 * a) == pytest.approx([1.0, 1.0])
    assert cosines(a, np.array([[0.0, 1.0], [1.0, 1.0]]))[0] == pytest.approx(0.0)


def test_a_client_that_cannot_be_made_fails_the_cell_without_hanging() -> None:
    made: list[int] = []

    def make() -> object:
        made.append(1)
        if len(made) == 2:
            raise ConnectionError("no server")
        return lambda texts: None

    with pytest.raises(ConnectionError, match="no server"):
        run_cell("x", make, ["a"], concurrency=3, requests=6)
