"""The soak's leak arithmetic (the soak itself runs in `make soak`)."""

from __future__ import annotations

import math

from tritonforge.loadtest.reliability.soak import growth_per_10k


def test_flat_memory_is_no_growth() -> None:
    assert abs(growth_per_10k([0, 1000, 2000, 3000], [100.0, 100.0, 100.0, 100.0])) < 1e-9


def test_linear_leak_is_measured_per_10k_requests() -> None:
    # 1 MB per 1000 requests -> 10 MB per 10k
    assert math.isclose(growth_per_10k([0, 1000, 2000, 3000], [50.0, 51.0, 52.0, 53.0]), 10.0)


def test_dead_process_is_infinite_growth() -> None:
    assert growth_per_10k([0, 1000], [50.0, float("nan")]) == float("inf")
