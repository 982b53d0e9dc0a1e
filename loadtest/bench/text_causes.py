"""The text targets' measured causes (issue #35: every target printed as met or missed *with its
measured cause*), from what each served cell already records: Triton's per-model statistics
over the cell (queue and compute per request in the models the route calls) and the server's
CPU per request (the server process tree's CPU time over the requests served)."""

from __future__ import annotations

import math
import os
from typing import Any

COMPUTE = ("compute_input", "compute_infer", "compute_output")


def per_request_ms(stats: dict[str, float], key: str) -> float:
    """Triton's statistic ``key`` (``queue``, ``compute_infer``, ...) of one model: mean ms."""
    return stats.get(f"{key}_ns", 0.0) / max(1.0, stats.get(f"{key}_count", 0.0)) / 1e6


def server_split(row: dict[str, Any]) -> tuple[float, float] | None:
    """``(queue_ms, compute_ms)`` per request, summed over the models the route's ensemble
    calls (its own statistics left out: they hold its steps' again); None without statistics."""
    stats = {m: v for m, v in (row.get("server_stats") or {}).items() if m != row.get("model")}
    if not any(v.get("inference_count") for v in stats.values()):
        return None
    queue = sum(per_request_ms(v, "queue") for v in stats.values())
    compute = sum(per_request_ms(v, k) for v in stats.values() for k in COMPUTE)
    return queue, compute


def one_client_cause(row: dict[str, Any], inprocess_per_s: float) -> str:
    """Where a lone request's time goes against the in-process loop's, in means (a closed loop
    of one client: 1000 / rate ms a request; Triton's statistics are means too): inside
    Triton's models (queues and compute) and outside them (the front, the protocols, the
    client)."""
    split = server_split(row)
    if split is None:
        return "no server statistics (an admin key is needed for them against a remote server)"
    queue, compute = split
    served_ms = 1000.0 * row["concurrency"] / row["sentences_per_s"]
    return (
        f"a request takes {served_ms:.1f} ms on average against the loop in process's "
        f"{1000.0 / inprocess_per_s:.1f}: inside the models {queue + compute:.1f} ms (queues "
        f"{queue:.2f}, compute {compute:.1f}), outside them {served_ms - queue - compute:.1f} ms "
        "(the front, the protocols, the client)"
    )


def throughput_cause(
    row: dict[str, Any], inprocess_per_s: float, goal: float, cores: int | None = None
) -> str:
    """Whether the server's CPU per request bounds the served rate under ``goal`` x the
    in-process limit on this host's ``cores``."""
    cpu_ms = row.get("server_cpu_ms_per_request", math.nan)
    if cpu_ms is None or math.isnan(cpu_ms) or cpu_ms <= 0:
        return "no server CPU figure (a remote server)"
    cores = cores or os.cpu_count() or 1
    ceiling = cores * 1000.0 / cpu_ms
    split = server_split(row)
    queued = f"; {split[0]:.1f} ms a request in the models' queues" if split else ""
    bound = "CPU-bound" if ceiling < goal * inprocess_per_s else "not CPU-bound"
    return (
        f"{bound}: the server spends {cpu_ms:.1f} ms of CPU a request, so {cores} cores serve "
        f"at most {ceiling:.0f}/s against the in-process limit's {inprocess_per_s:.0f}/s"
        f"{queued}"
    )
