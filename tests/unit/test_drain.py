"""tritonforge.drain: the container's drain before stop (compose `run`, Kubernetes `wait`)."""

from __future__ import annotations

import http.server
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tritonforge import drain

METRICS = """# HELP nv_inference_pending_request_count Instantaneous number of pending requests
nv_inference_pending_request_count{model="embed",version="1"} %d
nv_inference_request_success{model="embed",version="1"} %d
nv_inference_request_failure{model="embed",reason="REJECTED",version="1"} 1
"""


def test_traffic_sums_pending_and_completed() -> None:
    assert drain.traffic(METRICS % (3, 10)) == (3.0, 11.0)
    assert drain.traffic("") == (0.0, 0.0)


def test_traffic_counts_the_generate_engines_sequences_as_pending() -> None:
    # a decoupled model's sequences still decoding are in flight, though Triton counts them
    # as neither pending nor completed: SIGTERM before they end crashed tritonserver
    engine = (
        'tritonforge_generate_running_sequences{model="generate",variant="fp32"} 2\n'
        'tritonforge_generate_queued_sequences{model="generate_int8",variant="int8"} 1\n'
    )
    assert drain.traffic(METRICS % (0, 4) + engine) == (3.0, 5.0)


def test_wait_until_quiet_waits_for_pending_and_completions_to_stop() -> None:
    snapshots = iter([(2, 0), (1, 1), (0, 2), (0, 3)] + [(0, 3)] * 1000)
    assert drain.wait_until_quiet(lambda: METRICS % next(snapshots), 5, quiet_s=0.05, poll_s=0.001)
    busy = iter(range(100000))
    assert not drain.wait_until_quiet(lambda: METRICS % (1, next(busy)), 0.2, poll_s=0.001)
    assert not drain.wait_until_quiet(lambda: METRICS % (0, 0), 5, alive=lambda: False)

    def down() -> str:
        raise ConnectionRefusedError

    assert not drain.wait_until_quiet(down, 5)


class Metrics:
    """A /metrics endpoint whose pending count the test sets."""

    def __init__(self) -> None:
        self.pending = 1
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = (METRICS % (owner.pending, 5)).encode()
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"


@pytest.fixture
def metrics() -> Iterator[Metrics]:
    m = Metrics()
    yield m
    m.server.shutdown()


CHILD = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: (print("child got SIGTERM", flush=True), sys.exit(7)))
print("child up", flush=True)
time.sleep(60)
"""


def test_run_forwards_sigterm_only_after_the_drain(metrics: Metrics, tmp_path: Path) -> None:
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tritonforge.drain", "run", "--metrics-url", metrics.url,
         "--timeout-s", "20", "--quiet-s", "0.2", "--", sys.executable, str(child)],
        stdout=subprocess.PIPE, text=True, cwd=Path(drain.__file__).parent.parent,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "child up"
    proc.send_signal(signal.SIGTERM)
    time.sleep(1.0)
    assert proc.poll() is None  # a request is still pending: the child keeps running
    metrics.pending = 0
    out, _ = proc.communicate(timeout=20)
    assert out.splitlines() == ["tritonforge.drain: drained", "child got SIGTERM"]
    assert proc.returncode == 7  # the server's exit status


def test_wait_mode_never_fails_the_prestop_hook(metrics: Metrics) -> None:
    started = time.monotonic()
    assert drain.main(["wait", "--metrics-url", metrics.url, "--timeout-s", "0.5"]) == 0
    assert time.monotonic() - started < 5
