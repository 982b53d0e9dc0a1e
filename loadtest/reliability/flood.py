"""A flood of ``generate_stream`` streams: how fast is "no"? (issue #36 item 2).

``python -m tritonforge.loadtest.reliability.flood`` (``make flood``) starts the embedded server
of ``--model-repository`` on free ports (or floods ``--http-url``), opens ``--streams`` SSE
streams at once (default: the decoupled model's ``max_running + max_queue + 16``, 96 for
``generate``: what ``make chaos`` floods with), reads each to its end and reports every stream's
outcome and latency: accepted (200) and finished, accepted and cut (an error event, or no
``finish_reason``), refused (503 at once or as the first event) with its ``Retry-After``.

The gate (exit status 1 when breached): every refusal carries ``Retry-After``, no accepted stream
is cut, and every refusal arrives within ``--max-refusal-s`` (1 s). Before the generate scheduler
predicted its queue's wait, the refusals of a 96-stream flood came after up to 10.5 s (they waited
out ``queue_timeout_s``). A measurement, not part of ``make test``: the integration test counts the
same outcomes without a bound on time.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tritonforge.generation import TEXT_INPUT
from tritonforge.loadtest.reliability.chaos.probes import read_sse
from tritonforge.modelconfig import ModelConfig
from tritonforge.repository import load_model_config, model_names

EXTRA_STREAMS = 16  # past the model's running + queued capacity, as the chaos flood
MAX_REFUSAL_S = 1.0
PROMPT = "flood: tell me a long story about a lighthouse keeper"


@dataclass
class Stream:
    """One stream's outcome: ``status`` of the answer (a first-event error gives its status),
    ``latency_s`` until the stream ended, ``first_s`` until its first byte of body."""

    status: int
    latency_s: float
    first_s: float
    retry_after: str | None = None
    events: int = 0
    finished: bool = False
    error: str = ""

    @property
    def refused(self) -> bool:
        return self.status == 503

    @property
    def cut(self) -> bool:
        """Accepted (200), then ended without its final chunk."""
        return self.status == 200 and (bool(self.error) or not self.finished)


@dataclass
class FloodReport:
    model: str
    streams: int
    accepted: int = 0
    finished: int = 0
    cut: int = 0
    refused: int = 0
    other: int = 0
    refusal_latencies_s: list[float] = field(default_factory=list)
    refusals_without_retry_after: int = 0
    slowest_refusal_s: float = 0.0
    slowest_accepted_s: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, model: str, outcomes: Sequence[Stream]) -> FloodReport:
        report = cls(model, len(outcomes))
        for s in outcomes:
            if s.refused:
                report.refused += 1
                report.refusal_latencies_s.append(round(s.latency_s, 3))
                report.refusals_without_retry_after += s.retry_after is None
            elif s.status == 200:
                report.accepted += 1
                report.finished += not s.cut
                report.cut += s.cut
                report.slowest_accepted_s = max(report.slowest_accepted_s, s.latency_s)
            else:
                report.other += 1
            if s.error:
                key = f"{s.status} {s.error[:100]}"
                report.errors[key] = report.errors.get(key, 0) + 1
        report.refusal_latencies_s.sort()
        report.slowest_refusal_s = max(report.refusal_latencies_s, default=0.0)
        return report

    def breaches(self, max_refusal_s: float = MAX_REFUSAL_S) -> list[str]:
        out = []
        if self.refusals_without_retry_after:
            out.append(f"{self.refusals_without_retry_after} refusals without Retry-After")
        if self.cut:
            out.append(f"{self.cut} accepted streams cut (gate: 0)")
        if self.other:
            out.append(f"{self.other} streams neither accepted nor refused with 503")
        if self.slowest_refusal_s > max_refusal_s:
            slow = sum(1 for t in self.refusal_latencies_s if t > max_refusal_s)
            out.append(
                f"{slow} refusals slower than {max_refusal_s:g} s, the slowest after "
                f"{self.slowest_refusal_s:.2f} s"
            )
        return out


def decoupled_model(repository: Path) -> tuple[str, ModelConfig]:
    """The first decoupled (streaming) model of ``repository`` that takes ``text_input``."""
    for name in model_names(repository):
        config = load_model_config(repository, name)
        policy = config.raw.get("model_transaction_policy", {})
        if policy.get("decoupled") and any(s.name == TEXT_INPUT for s in config.inputs):
            return name, config
    raise SystemExit(f"no decoupled model taking {TEXT_INPUT} in {repository}: run make export")


def flood_size(config: ModelConfig) -> int:
    """``max_running + max_queue`` of the model's config, plus :data:`EXTRA_STREAMS`."""
    params = config.parameters
    return int(params["max_running"]) + int(params["max_queue"]) + EXTRA_STREAMS


def one_stream(
    http_url: str, model: str, body: dict[str, Any], timeout_s: float, t0: float
) -> Stream:
    """Open one SSE ``generate_stream`` at ``http_url`` (``host:port``) and read it to its end
    (the chaos probe's reader, :func:`~tritonforge.loadtest.reliability.chaos.probes.read_sse`)."""
    read = read_sse(http_url, model, body, timeout_s, t0)
    if read.exception is not None:
        return Stream(0, read.end_s, read.end_s, error=read.error)
    return Stream(
        read.status, read.end_s, read.headers_s, read.retry_after, read.events, read.finished,
        read.error,
    )  # fmt: skip


def flood(
    http_url: str, model: str, streams: int, max_tokens: int | None = None, timeout_s: float = 120
) -> FloodReport:
    """Open ``streams`` SSE streams to ``model`` at once; their report."""
    body: dict[str, Any] = {TEXT_INPUT: PROMPT}
    if max_tokens is not None:
        body["parameters"] = {"max_tokens": max_tokens}
    with concurrent.futures.ThreadPoolExecutor(max_workers=streams) as pool:
        t0 = time.monotonic()
        futures = [
            pool.submit(one_stream, http_url, model, body, timeout_s, t0) for _ in range(streams)
        ]
        outcomes = [f.result() for f in futures]
    return FloodReport.of(model, outcomes)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    p.add_argument("--http-url", help="flood this front (host:port) instead of starting one")
    p.add_argument("--streams", type=int, help="default: max_running + max_queue + 16")
    p.add_argument("--max-tokens", type=int, help="default: the model's default_max_new_tokens")
    p.add_argument("--max-refusal-s", type=float, default=MAX_REFUSAL_S)
    p.add_argument("--out", type=Path, help="write the report as JSON there")
    args = p.parse_args(argv)
    model, config = decoupled_model(args.model_repository)
    streams = args.streams or flood_size(config)
    if args.http_url:
        report = flood(args.http_url, model, streams, args.max_tokens)
    else:
        from tritonforge.runtime.serving import serving

        with serving(
            args.model_repository, model_control_mode="explicit", load_models=[model]
        ) as server:
            report = flood(server.http_url, model, streams, args.max_tokens)
    breaches = report.breaches(args.max_refusal_s)
    print(json.dumps({**asdict(report), "breaches": breaches}, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({**asdict(report), "breaches": breaches}, indent=2) + "\n")
    return 1 if breaches else 0


if __name__ == "__main__":
    sys.exit(main())
