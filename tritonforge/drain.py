"""Drain before stop, for the container (standard library only: it runs on the image's Python).

Triton 2.51 stops every model's scheduler at once on SIGTERM, which fails ensemble/BLS requests
caught between two stages (server#6287). Draining first waits until no request is queued and none
completed for ``quiet_s`` (nothing in flight), bounded by a timeout, from Triton's own metrics.

    python3 -m tritonforge.drain wait [--min-wait-s 5] [--timeout-s 20]   # Kubernetes preStop
    python3 -m tritonforge.drain run -- tritonserver --model-repository=/models ...   # compose

``run`` starts the command, forwards SIGINT/SIGTERM to it only after draining, and exits with its
status, so ``docker compose stop`` (``stop_grace_period``) drains like the Kubernetes ``preStop``
hook and like ``tritonforge serve``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence

DEFAULT_METRICS_URL = "http://127.0.0.1:8002/metrics"
PENDING = "nv_inference_pending_request_count"
COMPLETED = ("nv_inference_request_success", "nv_inference_request_failure")
# the decoupled generate model's own gauges (stages/generate_model.py): sequences still decoding
# or queued in its engine are in flight too, though Triton counts them as neither
IN_ENGINE = ("tritonforge_generate_running_sequences", "tritonforge_generate_queued_sequences")


def traffic(metrics_text: str) -> tuple[float, float]:
    """(pending requests, completed requests) summed over all models, from Prometheus text."""
    pending = done = 0.0
    for line in metrics_text.splitlines():
        name, _, value = line.partition(" ")
        if name.startswith(PENDING) or name.startswith(IN_ENGINE):
            pending += float(value.split()[0])
        elif name.startswith(COMPLETED):
            done += float(value.split()[0])
    return pending, done


def fetch_metrics(url: str = DEFAULT_METRICS_URL, timeout_s: float = 2.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return str(resp.read().decode())


def wait_until_quiet(
    fetch: Callable[[], str],
    timeout_s: float,
    quiet_s: float = 0.5,
    alive: Callable[[], bool] = lambda: True,
    poll_s: float = 0.05,
) -> bool:
    """True once nothing is queued and the completed count has not moved for ``quiet_s``;
    False at the timeout, when the server stops answering, or when ``alive()`` turns False."""
    deadline = time.monotonic() + timeout_s
    last: tuple[float, float] | None = None
    quiet_since = time.monotonic()
    while time.monotonic() < deadline and alive():
        try:
            snapshot = traffic(fetch())
        except OSError:
            return False
        if snapshot != last or snapshot[0] > 0:
            last, quiet_since = snapshot, time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_s:
            return True
        time.sleep(poll_s)
    return False


def drain(url: str, min_wait_s: float, timeout_s: float, quiet_s: float) -> bool:
    """Wait ``min_wait_s`` (load balancers stop sending), then until quiet (bounded)."""
    time.sleep(min_wait_s)
    drained = wait_until_quiet(
        lambda: fetch_metrics(url), max(0.0, timeout_s - min_wait_s), quiet_s
    )
    print(f"tritonforge.drain: {'drained' if drained else 'drain timed out'}", flush=True)
    return drained


def run(
    command: Sequence[str], url: str, min_wait_s: float, timeout_s: float, quiet_s: float
) -> int:
    """Run ``command``; on SIGTERM/SIGINT drain, then pass the signal on; its exit status."""
    proc = subprocess.Popen(list(command))
    stopping = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        if stopping.is_set():
            return
        stopping.set()

        def stop() -> None:
            drain(url, min_wait_s, timeout_s, quiet_s)
            if proc.poll() is None:
                proc.send_signal(signum)

        threading.Thread(target=stop, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return proc.wait()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m tritonforge.drain", description=__doc__)
    p.add_argument("mode", choices=["wait", "run"], help="run: the server command follows --")
    p.add_argument(
        "--metrics-url", default=os.environ.get("TRITONFORGE_METRICS_URL", DEFAULT_METRICS_URL)
    )
    p.add_argument("--min-wait-s", type=float, default=0.0)
    p.add_argument("--timeout-s", type=float, default=20.0)
    p.add_argument("--quiet-s", type=float, default=0.5)
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args, command = p.parse_args(argv[:split]), argv[split + 1 :]
    if args.mode == "wait":
        drain(args.metrics_url, args.min_wait_s, args.timeout_s, args.quiet_s)
        return 0  # a preStop hook that fails only delays the stop; never block it
    if not command:
        p.error("run needs the server command after --")
    return run(command, args.metrics_url, args.min_wait_s, args.timeout_s, args.quiet_s)


if __name__ == "__main__":
    sys.exit(main())
