"""Issue #36 item 2 on the real embedded Triton: a flood of ``generate`` streams (the model's
running + queued capacity + 16, 96 for the spec's 16 + 64) is refused early and cleanly.

Before, the streams past the decoding slots waited out ``queue_timeout_s`` (10 s) in the queue
before hearing no. Now the scheduler predicts each request's wait and refuses those past the
deadline at once. Counted here (no timing: ``make flood`` gates the latency, 1 s): every refusal
is a 503 with ``Retry-After``, nothing else fails, no accepted stream is cut, and the refusals
of the generate model itself say it predicted the wait (not that the deadline ran out). With
``max_tokens`` 16 a request's prefill weighs as much as its decoding: a forecast blind to it
admitted too many, then refused them seconds late or at the deadline.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import PIPELINE_REPOSITORY
from tests.integration.reliability import linked_repository
from tritonforge.loadtest.reliability.flood import decoupled_model, flood, flood_size
from tritonforge.runtime.serving import serving

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("max_tokens", [None, 16], ids=["default-tokens", "16-tokens"])
def test_a_flood_of_generate_streams_is_refused_early_with_retry_after(
    tmp_path: Path, max_tokens: int | None
) -> None:
    try:
        model, config = decoupled_model(PIPELINE_REPOSITORY)
    except SystemExit:
        pytest.skip(reason="no generate model exported: run `make export`")
    repo = linked_repository(tmp_path / "repo", (model,))
    with serving(repo, model_control_mode="explicit", load_models=[model]) as server:
        report = flood(server.http_url, model, flood_size(config), max_tokens)
    print(report)  # the latencies, for the record
    assert report.accepted + report.refused == report.streams, report
    assert report.refused and report.accepted, report
    assert report.refusals_without_retry_after == 0, report
    assert report.cut == 0 and report.finished == report.accepted, report
    late = {e: n for e, n in report.errors.items() if "queued longer than" in e}
    assert not late, late  # refused when predicted, not when the deadline came
