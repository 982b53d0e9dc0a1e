"""The options every tritonforge locustfile adds to Locust's parser, each with its environment
variable, declared once: :mod:`loadtest.locust.common` adds them, and the launchers
(``tritonforge loadtest``, ``bench``) check the environment against them before anything starts,
so ``TRITONFORGE_SLO_P95_MS=abc`` is one line naming the variable (Locust's parser would name only
the option, after the server had started). No Locust import here: the bench must never import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tritonforge.client.settings import PIPELINES
from tritonforge.env import env_choice, env_float, env_int


@dataclass(frozen=True)
class Option:
    flag: str
    default: Any
    env: str | None = None
    choices: tuple[str, ...] | None = None
    help: str | None = None


OPTIONS: tuple[Option, ...] = (
    Option(
        "--pipeline", "ensemble", "TRITONFORGE_PIPELINE", PIPELINES,
        "orchestration to call (the pipeline's ensembles or its BLS)",
    ),
    Option(
        "--variant", "fp32", "TRITONFORGE_VARIANT",
        help="encoder variant (one the discovered pipeline serves)",
    ),
    Option(
        "--pipeline-name", "", "TRITONFORGE_PIPELINE_NAME",
        help="pipeline name (default: the discovered default pipeline of the users' task)",
    ),
    Option(
        "--model-repository", "", "TRITONFORGE_MODEL_REPOSITORY",
        help="discover the pipelines from this repository (default: the server's configs)",
    ),
    Option(
        "--dim", 0,
        help="FastAPI baseline: the embedding size to validate (default: the first answer's)",
    ),
    Option(
        "--labels", "",
        help="FastAPI classify baseline: comma-separated labels to validate (default: any)",
    ),
    Option(
        "--grpc-url", "", "TRITONFORGE_GRPC_URL",
        help="host:port of Triton's gRPC endpoint (default: the --host's host, port 8001)",
    ),
    Option("--texts-per-request", 1, "TRITONFORGE_TEXTS_PER_REQUEST"),
    Option("--embed-path", "/embed", help="FastAPI baseline route"),
    Option("--predict-path", "/predict", help="FastAPI classifier route"),
    Option("--slo-p95-ms", 1000.0, "TRITONFORGE_SLO_P95_MS"),
    Option("--slo-p99-ms", 2000.0, "TRITONFORGE_SLO_P99_MS"),
    Option("--slo-min-rps", 5.0, "TRITONFORGE_SLO_MIN_RPS"),
    Option("--slo-max-fail-ratio", 0.01, "TRITONFORGE_SLO_MAX_FAIL_RATIO"),
    Option("--samples-out", "", help="write exact latencies (JSON) here"),
    Option(
        "--request-timeout-s", 8.0, "TRITONFORGE_LOADTEST_REQUEST_TIMEOUT_S",
        help="a request unanswered after this long is a failure; below Locust's 10 s stop "
        "timeout, so a hung call can no longer stall the run's shutdown",
    ),
    Option(
        "--warmup-s", 0.0, help="samples ending earlier than this after spawning are not written"
    ),
)  # fmt: skip


def add_options(parser: Any) -> None:
    """Add :data:`OPTIONS` to Locust's (configargparse) parser."""
    for o in OPTIONS:
        extra: dict[str, Any] = {"env_var": o.env} if o.env else {}
        if o.choices:
            extra["choices"] = o.choices
        parser.add_argument(o.flag, type=type(o.default), default=o.default, help=o.help, **extra)


def check_environment() -> None:
    """Raise :class:`tritonforge.env.EnvironmentValueError` naming the first variable of
    :data:`OPTIONS` whose value Locust could not parse."""
    for o in OPTIONS:
        if o.env is None:
            continue
        if o.choices:
            env_choice(o.env, o.choices, o.default)
        elif isinstance(o.default, float):
            env_float(o.env, o.default)
        elif isinstance(o.default, int):
            env_int(o.env, o.default)
