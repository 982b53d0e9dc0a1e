"""Graceful degradation of the BLS: when to answer from a cheaper variant, and counting it.

:class:`DegradePolicy` is read from the BLS config (``parameters.degrade_*``);
:class:`LoadMonitor` tells, from an instance's own executes, when it is overloaded; :func:`refused`
tells a stage call the stage's queue turned away; :func:`degraded_counter` counts the degraded
answers on Triton's ``/metrics`` (docs/reliability.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tritonforge.errors import ModelConfigError, StageUnavailableError
from tritonforge.modelconfig import ModelConfig

DEGRADED_METRIC = "tritonforge_degraded_answers_total"
# Triton's words when a model's queue refuses a request (full, or waited past its timeout).
_REFUSED_HINTS = ("exceeds maximum queue size", "request timeout expired")
# Two executes of one instance closer than this ran back to back: the queue was not empty.
# Measured under load (2 shared cores): the stub's gap between back-to-back executes exceeded
# 5 ms, so 5 ms never saw a queue; 50 ms does, and an idle instance rarely restarts that soon.
BUSY_GAP_S = 0.05


@dataclass(frozen=True)
class DegradePolicy:
    """When to answer from ``to`` instead of the default variant (``parameters.degrade_*``).

    ``enabled``: for every request that does not forbid it; else only for those asking for it.
    """

    enabled: bool = False
    to: str = "int8"
    max_queued: int = 4
    max_queue_delay_ms: int = 250

    @classmethod
    def from_config(cls, config: ModelConfig) -> DegradePolicy:
        enabled = config.param("degrade_enabled", "false", str).strip().lower()
        if enabled not in ("true", "false"):
            raise ModelConfigError(
                f"{config.name!r}: parameters.degrade_enabled must be true or false, got "
                f"{enabled!r}"
            )
        policy = cls(
            enabled=enabled == "true",
            to=config.param("degrade_to", cls.to, str),
            max_queued=config.param("degrade_max_queued", cls.max_queued, int),
            max_queue_delay_ms=config.param(
                "degrade_max_queue_delay_ms", cls.max_queue_delay_ms, int
            ),
        )
        if policy.max_queued < 1 or policy.max_queue_delay_ms < 1:
            raise ModelConfigError(
                f"{config.name!r}: parameters.degrade_max_queued / degrade_max_queue_delay_ms "
                "must be >= 1"
            )
        return policy


class LoadMonitor:
    """One BLS instance's view of its own queue, from the executes it runs (no server calls).

    Each ``execute`` receives every request that waited while the instance was busy, so the
    number of requests is the backlog it found; when it starts right after the previous one
    ended (within :data:`BUSY_GAP_S`) the oldest of them waited at most since the previous
    one started, the delay estimate. ``clock`` is injectable for tests.
    """

    def __init__(self, policy: DegradePolicy, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self.clock = clock
        self._last_start: float | None = None
        self._last_end: float | None = None

    def start(self, n_requests: int) -> bool:
        """Record an execute's start; True when the instance is overloaded (degrade)."""
        now = self.clock()
        waited_s = 0.0
        last_start, last_end = self._last_start, self._last_end
        if last_start is not None and last_end is not None and now - last_end <= BUSY_GAP_S:
            waited_s = now - last_start
        self._last_start = now
        return (
            n_requests > self.policy.max_queued
            or waited_s * 1000.0 >= self.policy.max_queue_delay_ms
        )

    def end(self) -> None:
        self._last_end = self.clock()


def refused(error: BaseException) -> bool:
    """True when a stage call failed because the stage's queue refused it (full or timed out)."""
    message = str(error).lower()
    return isinstance(error, StageUnavailableError) and any(h in message for h in _REFUSED_HINTS)


def degraded_counter(pb_utils: Any, pipeline: str, model: str) -> Callable[[str, int], None]:
    """``count(to_variant, n)``: Triton's custom metric :data:`DEGRADED_METRIC` (``/metrics``),
    labelled by pipeline, model and variant; a no-op where the stub has no metrics API."""
    family_cls = getattr(pb_utils, "MetricFamily", None)
    if family_cls is None:
        return lambda _to, _n: None
    family = family_cls(
        name=DEGRADED_METRIC,
        description="answers served by a degraded (cheaper) variant because the default one "
        "was overloaded",
        kind=family_cls.COUNTER,
    )
    metrics: dict[str, Any] = {}

    def count(to: str, n: int) -> None:
        if to not in metrics:
            metrics[to] = family.Metric(labels={"pipeline": pipeline, "model": model, "to": to})
        metrics[to].increment(n)

    return count
