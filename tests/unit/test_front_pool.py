"""The front's short-request pool is no hidden queue in front of Triton's bounded ones (#24).

When the pool is smaller than what a model can hold (its queue, per priority level, plus the
requests its instances are executing), a peak waits in the front for a free connection, up to
``queue_timeout_s``: Triton's ``max_queue_size`` never refuses, the BLS never sees the backlog it
degrades on, and p99 grows to seconds (measured: docs/reliability.md, the ramp)."""

from __future__ import annotations

import pytest

from tritonforge.export.pipeline_spec import PipelineSpec
from tritonforge.export.specs import get_pipeline, pipeline_names
from tritonforge.runtime.front.settings import FrontLimits


def held_requests(spec: PipelineSpec) -> dict[str, int]:
    """Requests each public entry stage can hold at once: queued (each priority level has its
    own ``max_queue_size``) plus executing (an execute takes up to ``max_batch`` requests)."""
    levels = max(1, spec.priority_levels)
    batch = spec.encoder.max_batch
    held = {
        "tokenizer": levels * spec.tokenizer.max_queue_size + spec.tokenizer.instance_count * batch
    }
    if spec.bls is not None:
        held["bls"] = levels * spec.bls.max_queue_size + spec.bls.instance_count * batch
    return held


@pytest.mark.parametrize("name", pipeline_names())
def test_the_front_pool_holds_what_each_entry_stage_can(name: str) -> None:
    pool = FrontLimits().max_upstream_connections
    held = held_requests(get_pipeline(name))
    assert max(held.values()) <= pool, (name, held, pool)
