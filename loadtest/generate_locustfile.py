"""Locust streaming users for the ``generate`` model (HTTP ``generate_stream`` SSE).

Each user sends a prompt, reads the event stream and records time to first token, inter-token
latency, request latency and output tokens (exact samples, also fired as Locust request events
``ttft``/``stream``). At quit the SLO gates run: exit status 1 naming each breach.

    python -m locust -f loadtest/generate_locustfile.py --headless -u 4 -r 4 -t 30s \
        --host http://127.0.0.1:8000 --max-tokens 16 --slo-ttft-p95-ms 2000
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from locust import HttpUser, events, task
from locust.env import Environment

from tritonforge.generation import FINISH_REASON, TEXT_INPUT, TEXT_OUTPUT
from tritonforge.loadtest.generate_slo import GenerationSlos, StreamSample, check, summarize

log = logging.getLogger("tritonforge.loadtest.generate")
PROMPTS = (
    "What is the capital of France?",
    "Explain how a bicycle works.",
    "Give me three tips for better sleep.",
    "Write a haiku about autumn.",
)
_samples: list[StreamSample] = []
_window: dict[str, float] = {}


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    parser.add_argument("--model", default="generate", help="Triton model name")
    parser.add_argument("--max-tokens", type=int, default=16)
    defaults = GenerationSlos()
    for name in (
        "ttft_p95_ms",
        "itl_p95_ms",
        "latency_p99_ms",
        "min_tokens_per_s",
        "max_fail_ratio",
    ):
        flag = "--slo-" + name.replace("_", "-")
        parser.add_argument(flag, type=float, default=getattr(defaults, name))
    parser.add_argument("--samples-out", default="", help="write the summary (JSON) here")


@events.test_start.add_listener
def _start(environment: Environment, **kwargs: Any) -> None:
    _window["start"] = time.monotonic()


class GenerateStreamUser(HttpUser):
    """Closed loop: one streamed generation after another."""

    @task
    def stream(self) -> None:
        options = self.environment.parsed_options
        prompt = PROMPTS[len(_samples) % len(PROMPTS)]
        body = {TEXT_INPUT: prompt, "parameters": {"max_tokens": options.max_tokens}}
        start = time.perf_counter()
        first = None
        chunks = 0
        error: Exception | None = None
        path = f"/v2/models/{options.model}/generate_stream"
        try:
            with self.client.post(
                path, json=body, stream=True, name="generate_stream", catch_response=True
            ) as response:
                if response.status_code != 200:
                    raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")
                for line in response.iter_lines():
                    if not line.startswith(b"data:"):
                        continue
                    event = json.loads(line[5:])
                    if "error" in event:
                        raise RuntimeError(str(event["error"]))
                    if event.get(TEXT_OUTPUT):
                        chunks += 1
                        if first is None:
                            first = time.perf_counter() - start
                    if event.get(FINISH_REASON):
                        break
                response.success()
        except Exception as e:  # recorded as a failed stream
            error = e
        total = time.perf_counter() - start
        ttft = first if first is not None else total
        itl = (total - ttft) / (chunks - 1) * 1000 if chunks > 1 else float("nan")
        _samples.append(StreamSample(ttft * 1000, itl, total * 1000, chunks, error is None))
        events.request.fire(
            request_type="SSE",
            name="ttft",
            response_time=ttft * 1000,
            response_length=0,
            exception=error,
            context={},
        )


@events.quitting.add_listener
def _quitting(environment: Environment, **kwargs: Any) -> None:
    options = environment.parsed_options
    if options is None:
        return
    window = time.monotonic() - _window.get("start", time.monotonic())
    summary = summarize(_samples, window)
    slos = GenerationSlos(
        ttft_p95_ms=options.slo_ttft_p95_ms,
        itl_p95_ms=options.slo_itl_p95_ms,
        latency_p99_ms=options.slo_latency_p99_ms,
        min_tokens_per_s=options.slo_min_tokens_per_s,
        max_fail_ratio=options.slo_max_fail_ratio,
    )
    if options.samples_out:
        Path(options.samples_out).write_text(json.dumps(summary.as_dict(), indent=2))
    log.info("generation summary: %s", summary.as_dict())
    breaches = check(slos, summary)
    if breaches:
        log.error("SLO BREACHED: %s", "; ".join(breaches))
        environment.process_exit_code = 1
    else:
        log.info("SLO OK: %s", slos)
        environment.process_exit_code = 0
