"""What the front costs: ``python -m tritonforge.runtime.cli.front_bench [--requests N]``.

Serves the same repository twice, behind the front and with Triton on the TCP ports itself
(``front=False``), and times sequential requests (1 client) to ``embed`` over HTTP and gRPC,
alternating the two servers request by request so machine noise hits both alike. Prints p50/mean latency
per path and the front/direct ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from tritonforge.runtime.launcher.settings import ServerSettings
from tritonforge.runtime.serving import EmbeddedServer

TEXT = "the front must cost as little latency as possible"


def _http_call(url: str, model: str) -> None:
    body = json.dumps(
        {"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": [TEXT]}]}
    ).encode()
    request = urllib.request.Request(f"http://{url}/v2/models/{model}/infer", data=body)
    with urllib.request.urlopen(request, timeout=30) as resp:
        resp.read()


def _grpc_call(client: grpcclient.InferenceServerClient, model: str) -> None:
    tensor = grpcclient.InferInput("text", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[TEXT.encode()]], dtype=np.object_))
    client.infer(model, [tensor], client_timeout=30)


def _http_ready(url: str) -> None:
    with urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=30) as resp:
        resp.read()


def _time(fn: object, n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append((time.perf_counter() - started) * 1e3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    parser.add_argument(
        "--model", default=None, help="default: the default embedding pipeline's (discovered)"
    )
    parser.add_argument("--requests", type=int, default=300, help="per path and server")
    args = parser.parse_args()
    if args.model is None:
        from tritonforge import tasks
        from tritonforge.client.discovery import choose
        from tritonforge.pipelines import from_repository

        pipelines = from_repository(args.model_repository)
        args.model = choose(pipelines, tasks.default().name).model("fp32")
    servers = {
        name: EmbeddedServer(ServerSettings.ephemeral(args.model_repository, front=front))
        for name, front in (("front", True), ("direct", False))
    }
    try:
        for server in servers.values():
            server.start().wait_ready()
        samples: dict[tuple[str, str], list[float]] = {}
        clients = {n: grpcclient.InferenceServerClient(s.grpc_url) for n, s in servers.items()}
        for name, server in servers.items():  # warm-up
            _time(lambda s=server: _http_call(s.http_url, args.model), 20)
            _time(lambda n=name: _grpc_call(clients[n], args.model), 20)
        calls = {
            "http": lambda n: _http_call(servers[n].http_url, args.model),
            "grpc": lambda n: _grpc_call(clients[n], args.model),
            # no model behind it: what the hop itself costs
            "http-ready": lambda n: _http_ready(servers[n].http_url),
            "grpc-ready": lambda n: clients[n].is_server_ready(),
        }
        for _ in range(args.requests):
            for call, fn in calls.items():
                for name in servers:  # request by request, so noise hits both paths alike
                    sample = _time(lambda f=fn, n=name: f(n), 1)
                    samples.setdefault((call, name), []).extend(sample)
        print(f"{args.model}, 1 client, {args.requests} requests per cell, interleaved (ms)")
        print(f"{'call':<11}{'path':<8}{'p50':>8}{'mean':>8}{'p99':>8}")
        for (protocol, name), values in sorted(samples.items()):
            p99 = float(np.percentile(values, 99))
            print(
                f"{protocol:<11}{name:<8}{statistics.median(values):8.2f}"
                f"{statistics.fmean(values):8.2f}{p99:8.2f}"
            )
        for protocol in ("http", "grpc", "http-ready", "grpc-ready"):
            front, direct = samples[(protocol, "front")], samples[(protocol, "direct")]
            print(
                f"{protocol}: front/direct p50 ratio "
                f"{statistics.median(front) / statistics.median(direct):.3f}, mean ratio "
                f"{statistics.fmean(front) / statistics.fmean(direct):.3f}, p50 overhead "
                f"{statistics.median(front) - statistics.median(direct):+.2f} ms"
            )
    finally:
        for server in servers.values():
            server.stop()


if __name__ == "__main__":
    main()
