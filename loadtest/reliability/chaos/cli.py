"""``python -m tritonforge.loadtest.reliability.chaos`` (``make chaos``): a bounded chaos run, supervised.

Serves the repository as ``serve`` does (explicit model control, the supervisor, the front),
sends mixed traffic at a fixed rate through every public model of every discovered pipeline
(gRPC and HTTP alternately; decoupled models over gRPC streams), and meanwhile a seeded fault
injector, every ``--fault-interval-s`` until ``--max-recovery-s`` + 5 s before the end, in turn: SIGSEGVs a random Python stub, floods a
decoupled (generate) model past its queue (``max_running + max_queue`` from its config, plus
``--flood-extra``), opens ``--sse-streams`` SSE streams at once, cancels gRPC streams and SSE
streams mid-answer, and sends malformed HTTP headers to the front.

It reports, per pipeline, requests sent / answered OK / answered with a clean error (an HTTP
status or gRPC status from the server) / shed (a clean overload refusal while that pipeline was
being flooded) / lost (connection reset, stream ended without its final response) / hung (no
answer within ``--timeout-s``), the longest unavailability (of any of its public models: no OK
answer in between), for each
killed stub when its pipeline answered again, and the supervisor's whole-server restarts. Exit 1
when a gate is breached (:func:`.outcomes.gates`): any lost or hung request; a pipeline whose own stub was
not killed answering < ``--min-ok-ratio`` of its requests OK (shed ones aside); a killed stub's
pipeline not back within ``--max-recovery-s``; any whole-server restart.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from pathlib import Path

from tritonforge.loadtest.reliability.chaos.injector import FAULTS, run_chaos
from tritonforge.loadtest.reliability.chaos.outcomes import print_report
from tritonforge.logs import run_main

log = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tritonforge.loadtest.reliability.chaos", description=__doc__
    )
    p.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    p.add_argument("--duration-s", type=float, default=600.0)
    p.add_argument("--rate", type=float, default=20.0, help="requests per second, all pipelines")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated of {FAULTS}")
    p.add_argument("--fault-interval-s", type=float, default=10.0)
    p.add_argument(
        "--timeout-s", type=float, default=60.0,
        help="per request (a flood's streams: 3x); no answer by then: hung",
    )  # fmt: skip
    p.add_argument("--min-ok-ratio", type=float, default=0.999)
    p.add_argument("--max-recovery-s", type=float, default=10.0)
    p.add_argument("--sse-streams", type=int, default=64)
    p.add_argument("--report", type=Path, default=Path("reports/chaos.json"))
    args = p.parse_args(argv)
    report = run_chaos(
        args.model_repository, args.duration_s, args.rate, args.seed,
        [f.strip() for f in args.faults.split(",") if f.strip()], args.fault_interval_s,
        args.timeout_s, args.min_ok_ratio, args.max_recovery_s, args.sse_streams,
    )  # fmt: skip
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(report.to_json(), indent=2))
    print_report(report)
    for breach in report.breaches:
        print(f"CHAOS FAILED: {breach}")
    if not report.breaches:
        print("chaos passed: every gate held")
    return 1 if report.breaches else 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
