"""Locust streaming users for the ``generate`` model (HTTP ``generate_stream`` SSE).

Each user sends a prompt, reads the event stream and records time to first token, inter-token
latency, request latency and output tokens (exact samples, also fired as Locust request events
``ttft``/``stream``). At quit the SLO gates run: exit status 1 naming each breach.

    python -m locust -f loadtest/locust/generate.py --headless -u 4 -r 4 -t 30s \
        --host http://127.0.0.1:8000 --max-tokens 16 --slo-ttft-p95-ms 2000

``OpenAIChatStreamUser`` streams the same prompts through OpenAI's ``/v1/chat/completions``
(``stream: true``; the key from ``$TRITONFORGE_OPENAI_API_KEY`` when set) under the same samples
and SLO gates; name the user class on the command line to pick one.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from locust import HttpUser, events, task
from locust.env import Environment

from tritonforge.generation import FINISH_REASON, TEXT_INPUT, TEXT_OUTPUT
from tritonforge.loadtest.errors import StreamError
from tritonforge.loadtest.locust import gevent_glue  # noqa: F401  (registers: gevent, gRPC, run time)
from tritonforge.loadtest.slo_generate import GenerationSlos, StreamSample, check, summarize

log = logging.getLogger("tritonforge.loadtest.locust.generate")
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
    """Closed loop: one streamed generation after another (v2 ``generate_stream``)."""

    @task
    def stream(self) -> None:
        options = self.environment.parsed_options
        prompt = PROMPTS[len(_samples) % len(PROMPTS)]
        body = {TEXT_INPUT: prompt, "parameters": {"max_tokens": options.max_tokens}}
        path = f"/v2/models/{options.model}/generate_stream"
        _measure(self, path, body, {}, "generate_stream", _v2_text)


class OpenAIChatStreamUser(HttpUser):
    """Closed loop through ``/v1/chat/completions`` with ``stream: true``."""

    @task
    def stream(self) -> None:
        options = self.environment.parsed_options
        prompt = PROMPTS[len(_samples) % len(PROMPTS)]
        body = {
            "model": options.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": options.max_tokens,
            "stream": True,
        }
        key = os.environ.get("TRITONFORGE_OPENAI_API_KEY") or "none"
        headers = {"Authorization": f"Bearer {key}"}
        _measure(self, "/v1/chat/completions", body, headers, "/v1/chat/completions", _v1_text)


def _v2_text(event: dict[str, Any]) -> tuple[str, bool]:
    """(text, final) of a ``generate_stream`` event."""
    if "error" in event:
        raise StreamError(str(event["error"]))
    return str(event.get(TEXT_OUTPUT) or ""), bool(event.get(FINISH_REASON))


def _v1_text(event: dict[str, Any]) -> tuple[str, bool]:
    """(text, final) of a ``chat.completion.chunk``."""
    if "error" in event:
        raise StreamError(str(event["error"]))
    choice = (event.get("choices") or [{}])[0]
    return str((choice.get("delta") or {}).get("content") or ""), bool(choice.get("finish_reason"))


def _measure(
    user: HttpUser,
    path: str,
    body: dict[str, Any],
    headers: dict[str, str],
    name: str,
    read: Any,
) -> None:
    """One streamed request: time to first text, inter-chunk latency, latency, chunks."""
    start = time.perf_counter()
    first = None
    chunks = 0
    error: Exception | None = None
    try:
        with user.client.post(
            path, json=body, headers=headers, stream=True, name=name, catch_response=True
        ) as response:
            if response.status_code != 200:
                raise StreamError(f"HTTP {response.status_code}: {response.text[:200]}")
            for line in response.iter_lines():
                if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                    continue
                text, final = read(json.loads(line[5:]))
                if text:
                    chunks += 1
                    if first is None:
                        first = time.perf_counter() - start
                if final:
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
