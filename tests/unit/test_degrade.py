"""Degradation in the BLS: the per-instance load monitor (fake clock), the per-request
``fallback`` rule, refusals that degrade, the metric, and the spec / config side."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tritonforge.bls import BlsPlan, EncoderTarget, TokenizerSettings
from tritonforge.bls_degrade import (
    BUSY_GAP_S,
    DEGRADED_METRIC,
    DegradePolicy,
    LoadMonitor,
    degraded_counter,
    refused,
)
from tritonforge.bls_parameters import request_fallback
from tritonforge.errors import InvalidInputError, ModelConfigError, StageUnavailableError
from tritonforge.export.errors import SpecError
from tritonforge.export.pipeline_spec import BlsStage, Degrade
from tritonforge.export.specs import get_pipeline
from tritonforge.export.tritonconfig import ArtifactIO, IOTensor, build_config
from tritonforge.modelconfig import ModelConfig
from tritonforge.text import TextLimits

FEEDS = {"input_ids": "input_ids"}


def plan(enabled: bool = False, missing: dict[str, str] | None = None) -> BlsPlan:
    return BlsPlan(
        text_input="text",
        output="embedding",
        tokenizer=TokenizerSettings("tokenizer", Path("tokenizer.json"), 256, 16),
        encoders={v: EncoderTarget(f"enc_{v}", FEEDS, "emb") for v in ("fp32", "int8")},
        default_variant="fp32",
        missing=missing or {},
        limits=TextLimits(),
        stage_timeout_ms=0,
        degrade=DegradePolicy(enabled=enabled, to="int8", max_queued=3, max_queue_delay_ms=100),
    )


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def run(monitor: LoadMonitor, clock: FakeClock, n_requests: int, duration_s: float) -> bool:
    overloaded = monitor.start(n_requests)
    clock.now += duration_s
    monitor.end()
    return overloaded


def test_monitor_idle_instance_is_never_overloaded_however_slow_one_execute_is() -> None:
    clock = FakeClock()
    monitor = LoadMonitor(plan().degrade, clock)
    assert not run(monitor, clock, 1, 5.0)  # the first execute waited for nothing
    clock.now += 1.0  # idle gap: the next lone request did not wait
    assert not run(monitor, clock, 1, 5.0)


def test_monitor_back_to_back_executes_estimate_the_queue_delay() -> None:
    clock = FakeClock()
    monitor = LoadMonitor(plan().degrade, clock)
    assert not run(monitor, clock, 2, 0.05)
    # starts right after the previous one ended: its requests waited up to 50 ms (< 100)
    clock.now += BUSY_GAP_S / 2
    assert not run(monitor, clock, 2, 0.2)
    clock.now += BUSY_GAP_S / 2
    assert run(monitor, clock, 2, 0.01)  # waited up to ~200 ms >= 100 ms
    clock.now += 0.5  # the queue drained (a gap): not overloaded any more
    assert not run(monitor, clock, 2, 0.01)


def test_monitor_backlog_over_the_bound_is_overloaded() -> None:
    clock = FakeClock()
    monitor = LoadMonitor(plan().degrade, clock)
    assert not run(monitor, clock, 3, 0.0)  # exactly max_queued
    clock.now += 1.0
    assert run(monitor, clock, 4, 0.0)


def test_fallback_is_off_unless_the_spec_or_the_request_turns_it_on() -> None:
    off, on = plan(enabled=False), plan(enabled=True)
    assert request_fallback({}, "fp32", off) is None
    assert request_fallback({"fallback": "int8"}, "fp32", off) == "int8"
    assert request_fallback({}, "fp32", on) == "int8"
    assert request_fallback({"fallback": "none"}, "fp32", on) is None  # the caller forbids it
    assert request_fallback({"fallback": "NONE"}, "fp32", on) is None
    # pinning a variant means "that one": no silent degradation unless asked for as well
    assert request_fallback({"variant": "fp32"}, "fp32", on) is None
    assert request_fallback({"variant": "fp32", "fallback": "int8"}, "fp32", on) == "int8"
    # already the cheap variant: nothing to fall back to
    assert request_fallback({"variant": "int8", "fallback": "int8"}, "int8", on) is None
    assert request_fallback('{"fallback": "int8"}', "fp32", off) == "int8"  # JSON parameters


def test_bad_fallback_names_the_field_and_the_choices() -> None:
    with pytest.raises(InvalidInputError, match=r"'fallback'='fp16'.*'none'.*'int8'"):
        request_fallback({"fallback": "fp16"}, "fp32", plan())
    with pytest.raises(InvalidInputError, match="fallback"):
        request_fallback({"fallback": True}, "fp32", plan())
    gone = plan(missing={"torchscript": "not exported"})
    with pytest.raises(StageUnavailableError, match=r"torchscript.*not exported"):
        request_fallback({"fallback": "torchscript"}, "fp32", gone)


def test_only_queue_refusals_degrade() -> None:
    assert refused(StageUnavailableError("stage 'e' failed: Exceeds maximum queue size"))
    assert refused(StageUnavailableError("stage 'e' failed: Request timeout expired"))
    assert not refused(StageUnavailableError("stage 'e' failed: stub process is not healthy"))
    assert not refused(InvalidInputError("Exceeds maximum queue size"))  # not a stage refusal


def config(**params: str) -> ModelConfig:
    return ModelConfig.from_json(
        {"name": "embed_bls", "parameters": {k: {"string_value": v} for k, v in params.items()}}
    )


def test_policy_from_config_defaults_and_errors() -> None:
    assert DegradePolicy.from_config(config()) == DegradePolicy()  # older configs: off
    policy = DegradePolicy.from_config(
        config(
            degrade_enabled="true",
            degrade_to="int8",
            degrade_max_queued="2",
            degrade_max_queue_delay_ms="50",
        )
    )
    assert policy == DegradePolicy(True, "int8", 2, 50)
    with pytest.raises(ModelConfigError, match="degrade_enabled"):
        DegradePolicy.from_config(config(degrade_enabled="yes"))
    with pytest.raises(ModelConfigError, match="degrade_max_queued"):
        DegradePolicy.from_config(config(degrade_max_queued="0"))


class FakeMetrics:
    """Records what the BLS does with the stub's metrics API."""

    COUNTER = "counter"

    def __init__(self) -> None:
        self.families: list[dict[str, Any]] = []
        self.counts: dict[str, int] = {}

    def __call__(self, **kwargs: Any) -> FakeMetrics:
        self.families.append(kwargs)
        return self

    def Metric(self, labels: dict[str, str]) -> Any:
        outer = self

        class Counter:
            def increment(self, n: int) -> None:
                key = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
                outer.counts[key] = outer.counts.get(key, 0) + n

        return Counter()


def test_degraded_answers_are_counted_per_pipeline_and_variant() -> None:
    metrics = FakeMetrics()
    pb_utils = type("pb", (), {"MetricFamily": metrics})
    count = degraded_counter(pb_utils, "embed", "embed_bls")
    count("int8", 3)
    count("int8", 2)
    assert metrics.families == [
        {
            "name": DEGRADED_METRIC,
            "description": metrics.families[0]["description"],
            "kind": "counter",
        }
    ]
    assert metrics.counts == {"model=embed_bls,pipeline=embed,to=int8": 5}
    # a stub without the metrics API: counting is a no-op, not an error
    degraded_counter(object(), "embed", "embed_bls")("int8", 1)


def test_spec_rejects_degrading_to_the_default_or_an_unserved_variant() -> None:
    spec = get_pipeline("minilm")
    assert spec.bls is not None and not spec.bls.degrade.enabled  # never on by default
    with pytest.raises(SpecError, match=r"degrade\.to 'fp32'"):
        dataclasses.replace(spec, bls=BlsStage(degrade=Degrade(to="fp32")))
    with pytest.raises(SpecError, match=r"degrade\.to 'torchscript'"):
        dataclasses.replace(
            spec,
            variants=("fp32", "int8"),
            bls=BlsStage(degrade=Degrade(enabled=True, to="torchscript")),
        )
    with pytest.raises(SpecError, match="max_queued"):
        dataclasses.replace(spec, bls=BlsStage(degrade=Degrade(max_queued=0)))
    with pytest.raises(SpecError, match="priority_levels"):
        dataclasses.replace(spec, priority_levels=-1)


def test_encoder_configs_carry_the_pipelines_priority_levels() -> None:
    spec = get_pipeline("minilm")
    assert spec.encoder.serving is not None
    assert spec.encoder.serving.priority_levels == spec.priority_levels == 2
    io = ArtifactIO(
        tuple(IOTensor(t.name, np.dtype(t.dtype), t.axes) for t in spec.encoder.inputs),
        tuple(IOTensor(t.name, np.dtype(t.dtype), t.axes) for t in spec.encoder.outputs),
    )
    for gpu in (False, True):
        batching = build_config(
            "encoder_fp32", "onnxruntime", "model.onnx", io, spec.encoder, None, gpu=gpu
        )["dynamic_batching"]
        assert batching["priority_levels"] == batching["default_priority_level"] == 2
    none = dataclasses.replace(spec, priority_levels=0)
    batching = build_config("encoder_fp32", "onnxruntime", "model.onnx", io, none.encoder, None)[
        "dynamic_batching"
    ]
    assert "priority_levels" not in batching
