"""``make perf``: perf_analyzer input data for every public model, and perf_analyzer run against the
real (restricted) server with the admin header."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import PIPELINE_REPOSITORY
from tritonforge.loadtest.perf_analyzer import inputs as perf_inputs
from tritonforge.loadtest.perf_analyzer.tool import binary
from tritonforge.repository import load_model_config
from tritonforge.runtime.serving import EmbeddedServer
from tritonforge.runtime.supervisor.model_graph import public_models

pytestmark = pytest.mark.integration
QUICK = ["--concurrency-range", "1", "--measurement-interval-ms", "500"]
STABLE_ENOUGH = ["--stability-percentage", "999", "--max-trials", "3"]


def test_input_files_cover_every_public_model_and_required_input(tmp_path: Path) -> None:
    targets = perf_inputs.write_inputs(PIPELINE_REPOSITORY, tmp_path, ["a text", "another"], rows=3)
    assert {t.model for t in targets} == set(public_models(PIPELINE_REPOSITORY))
    for target in targets:
        config = load_model_config(PIPELINE_REPOSITORY, target.model)
        data = json.loads(target.path.read_text())["data"]
        assert len(data) == 3
        required = {s.name for s in config.inputs if not s.optional}
        assert all(set(entry) == required for entry in data)


@pytest.mark.skipif(binary() is None, reason="perf_analyzer not installed (make perf installs it)")
def test_perf_analyzer_measures_a_restricted_server_with_the_admin_key(
    pipeline_server: EmbeddedServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    assert pipeline_server.settings.restrict_apis
    argv = ["embed", "--url", pipeline_server.grpc_url, "--out-dir", str(tmp_path), *QUICK]
    monkeypatch.delenv(perf_inputs.ADMIN_KEY_ENV, raising=False)
    assert perf_inputs.main([*argv, *STABLE_ENOUGH]) == 1
    refused = capfd.readouterr()
    assert "restricted" in (refused.out + refused.err).lower()  # the model-config API refused
    monkeypatch.setenv(perf_inputs.ADMIN_KEY_ENV, pipeline_server.settings.admin_key)
    assert perf_inputs.main([*argv, *STABLE_ENOUGH]) == 0
    out = capfd.readouterr().out
    assert "Concurrency: 1, throughput:" in out
    assert pipeline_server.settings.admin_key not in out  # the printed command hides the key
