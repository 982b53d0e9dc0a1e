"""A canary inference through every discovered pipeline: the container's liveness probe.

Triton 2.51 never restarts a crashed Python stub and stays live/ready (server#8604), so the probe
is a real inference. Which models to call is discovered from the repository's configs (the
``tritonforge.*`` parameters, :mod:`tritonforge.pipelines`), never named in a manifest: every
pipeline's fp32 ensemble and its BLS get one short text, as KServe-v2 JSON over HTTP.

    python3 -m tritonforge.canary --repository /models --url http://127.0.0.1:8000

Exit status 0 when every call answers 200 within ``--timeout-s``, else 1 naming each failure
(2: the repository declares no pipeline). Runs on the Triton image (stdlib + tritonclient's
protobuf to parse config.pbtxt).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from tritonforge.pipelines import PRIORITY_PARAMETER, TOP_PRIORITY, Pipeline, from_repository

CANARY_TEXT = "tritonforge liveness canary"


def canary_models(pipelines: dict[str, Pipeline]) -> list[tuple[Pipeline, str]]:
    """(pipeline, model) to call: each pipeline's fp32 ensemble (else its first) and its BLS."""
    out = []
    for pipeline in pipelines.values():
        first = "fp32" if "fp32" in pipeline.ensembles else next(iter(pipeline.ensembles), None)
        if first is not None:
            out.append((pipeline, pipeline.ensembles[first]))
        if pipeline.bls is not None:
            out.append((pipeline, pipeline.bls))
    return out


def request_body(pipeline: Pipeline) -> bytes:
    """One text into the pipeline's input, its first output back as JSON, at the top priority
    level (a probe must not queue behind bulk traffic at a peak and be taken for a dead pod)."""
    body = {
        "parameters": {PRIORITY_PARAMETER: TOP_PRIORITY},
        "inputs": [
            {"name": pipeline.input, "shape": [1, 1], "datatype": "BYTES", "data": [CANARY_TEXT]}
        ],
        "outputs": [{"name": pipeline.outputs[0].name, "parameters": {"binary_data": False}}],
    }
    return json.dumps(body).encode()


def probe(url: str, pipeline: Pipeline, model: str, timeout_s: float) -> str:
    """ "" when ``model`` answers 200, else what went wrong."""
    request = urllib.request.Request(
        f"{url.rstrip('/')}/v2/models/{model}/infer",
        data=request_body(pipeline),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return "" if response.status == 200 else f"HTTP {response.status}"
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}: {e.read()[:200].decode('utf-8', 'replace')}"
    except OSError as e:
        return f"{type(e).__name__}: {e}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tritonforge.canary", description=__doc__)
    parser.add_argument("--repository", type=Path, default=Path("/models"))
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="Triton's (or the front's)")
    parser.add_argument("--timeout-s", type=float, default=8.0, help="for all calls together")
    args = parser.parse_args(argv)
    targets = canary_models(from_repository(args.repository))
    if not targets:
        print(f"canary: {args.repository} declares no tritonforge pipeline", file=sys.stderr)
        return 2
    deadline = time.monotonic() + args.timeout_s
    failures = []
    for pipeline, model in targets:
        why = probe(args.url, pipeline, model, max(0.1, deadline - time.monotonic()))
        if why:
            failures.append(f"{model}: {why}")
    for failure in failures:
        print(f"canary failed: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
