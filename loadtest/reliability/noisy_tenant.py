"""A noisy neighbour: one tenant's latency with and without another one flooding past its limit
(issue #36 item 4). A measurement, not a gate: the integration test
(tests/integration/test_tenants.py) holds the 429s; this reports the quiet tenant's p50/p99.

``python -m tritonforge.loadtest.reliability.noisy_tenant --model-repository model_repository``
serves the repository's ``embed`` pipeline (``explicit`` model control, only it loaded) behind a
tenants file of two tenants: ``quiet`` (no limit) and ``noisy`` (``--noisy-rate`` requests per
second). It times ``--requests`` sequential v2 ``embed`` calls of ``quiet``, once alone and once
while ``--noisy-threads`` threads call as ``noisy`` as fast as they can (nearly all refused with
429), and prints both p50/p99 (ms), the noisy tenant's answers by status, and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import requests

from tritonforge.runtime.serving import serving
from tritonforge.runtime.tenants.http import TENANT_HEADER
from tritonforge.runtime.tenants.keys import hash_key

BODY: dict[str, Any] = {
    "inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": ["hi there"]}]
}
MODELS = ("tokenizer", "encoder_fp32", "embed")


def tenants_file(path: Path, noisy_rate: float) -> Path:
    path.write_text(
        f'[tenants.quiet]\nkeys = ["{hash_key("quiet-key")}"]\n\n'
        f'[tenants.noisy]\nkeys = ["{hash_key("noisy-key")}"]\n'
        f"requests_per_s = {noisy_rate}\nrequest_burst = 1\n"
    )
    return path


def timed_calls(url: str, key: str, n: int) -> list[float]:
    """Seconds of each of ``n`` sequential calls (each must answer 200)."""
    out = []
    with requests.Session() as s:
        for _ in range(n):
            started = time.perf_counter()
            answer = s.post(url, json=BODY, headers={TENANT_HEADER: key}, timeout=60)
            out.append(time.perf_counter() - started)
            answer.raise_for_status()
    return out


def flood(url: str, stop: threading.Event, statuses: Counter[int]) -> None:
    with requests.Session() as s:
        while not stop.is_set():
            answer = s.post(url, json=BODY, headers={TENANT_HEADER: "noisy-key"}, timeout=60)
            statuses[answer.status_code] += 1


def summary(seconds: list[float]) -> dict[str, float]:
    ms = sorted(1000 * s for s in seconds)
    return {
        "p50_ms": round(statistics.median(ms), 2),
        "p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 2),
    }


def measure(repository: Path, requests_n: int, threads: int, noisy_rate: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        path = tenants_file(Path(tmp) / "tenants.toml", noisy_rate)
        with serving(
            repository, tenants_file=path, model_control_mode="explicit", load_models=MODELS
        ) as server:
            url = f"http://{server.http_url}/v2/models/embed/infer"
            timed_calls(url, "quiet-key", 20)  # warm-up
            alone = timed_calls(url, "quiet-key", requests_n)
            stop, statuses = threading.Event(), Counter[int]()
            noisy = [
                threading.Thread(target=flood, args=(url, stop, statuses)) for _ in range(threads)
            ]
            for t in noisy:
                t.start()
            try:
                beside = timed_calls(url, "quiet-key", requests_n)
            finally:
                stop.set()
                for t in noisy:
                    t.join()
    return {
        "load_average": os.getloadavg(),
        "requests": requests_n,
        "quiet_alone": summary(alone),
        "quiet_beside_noisy": summary(beside),
        "noisy_threads": threads,
        "noisy_statuses": {str(k): v for k, v in sorted(statuses.items())},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tritonforge.loadtest.reliability.noisy_tenant")
    p.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--noisy-threads", type=int, default=4)
    p.add_argument("--noisy-rate", type=float, default=1.0, help="noisy's requests per second")
    args = p.parse_args(argv)
    report = measure(args.model_repository, args.requests, args.noisy_threads, args.noisy_rate)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
