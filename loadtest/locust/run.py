"""``python -m tritonforge.loadtest.locust.run``: a bounded, headless Locust run with SLO gates.

Starts the embedded Triton on free loopback ports (unless ``--url`` names a running server),
runs the ``--task``'s Locust users (its folder's ``loadtest``: ``LOCUSTFILE``, ``USERS``)
for ``--duration-s`` seconds with HTTP and/or gRPC users against the discovered pipeline
(``--pipeline-name``, default: the task's default pipeline), writes
CSV + HTML reports under ``--reports-dir`` and exits with Locust's status: 0 when every SLO holds,
1 naming each breached threshold. SLO thresholds: ``--slo-*`` options or ``TRITONFORGE_SLO_*``
environment variables (see :mod:`tritonforge.tasks.embedding.loadtest.locustfile`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from tritonforge import tasks
from tritonforge.client.settings import normalize_url
from tritonforge.env import env_float
from tritonforge.loadtest.locust.options import check_environment
from tritonforge.logs import run_main
from tritonforge.pipelines import ROUTES
from tritonforge.runtime.serving import serving

log = logging.getLogger(__name__)

# Per pipeline task: the locustfile and its users by protocol (its folder's ``loadtest`` module).
TASK_USERS = {
    name: (module.LOCUSTFILE, module.USERS)
    for name in tasks.names(tasks.PIPELINE)
    if (module := tasks.get(name).module("loadtest"))
}
LOCUSTFILE, USER_CLASSES = TASK_USERS[tasks.default().name]


def locust_command(
    *,
    locustfile: Path,
    user_classes: Sequence[str],
    host: str,
    users: int,
    duration_s: float,
    extra: Sequence[str] = (),
) -> list[str]:
    """The headless ``python -m locust`` command line (all users spawned at once)."""
    return [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(locustfile),
        "--headless",
        "--users",
        str(users),
        "--spawn-rate",
        str(users),
        "--run-time",
        f"{max(1, round(duration_s))}s",
        "--stop-timeout",
        "10",
        "--host",
        host,
        "--only-summary",
        *extra,
        *user_classes,
    ]


def exit_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so ``with serving(...)`` stops the embedded server (its own
    process group would otherwise outlive us)."""

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


@contextlib.contextmanager
def target(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """(HTTP host:port, gRPC host:port) of the server to load: given, or an embedded one."""
    if args.url:
        http = normalize_url(args.url)
        grpc = normalize_url(args.grpc_url) if args.grpc_url else f"{http.rsplit(':', 1)[0]}:8001"
        yield http, grpc
        return
    log.info("==> starting the embedded Triton on %s", args.model_repository)
    with serving(args.model_repository) as server:
        log.info("==> ready: HTTP %s  gRPC %s", server.http_url, server.grpc_url)
        yield server.http_url, server.grpc_url


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tritonforge.loadtest.locust.run", description=__doc__
    )
    parser.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    parser.add_argument(
        "--url",
        default=os.environ.get("TRITONFORGE_LOADTEST_URL") or None,
        help="HTTP host:port of a running server (skips the embedded server)",
    )
    parser.add_argument("--grpc-url", default=None, help="gRPC host:port (default: URL host:8001)")
    parser.add_argument("--protocol", choices=sorted(USER_CLASSES), default="both")
    parser.add_argument("--users", type=int, default=4, help="concurrent users (closed loop)")
    parser.add_argument(
        "--duration-s",
        type=float,
        default=env_float("TRITONFORGE_LOADTEST_DURATION_S", 30.0, minimum=0.1),
    )
    parser.add_argument("--task", choices=sorted(TASK_USERS), default=tasks.default().name)
    parser.add_argument(
        "--pipeline-name", default=None, help="pipeline (default: the task's discovered default)"
    )
    parser.add_argument("--pipeline", choices=ROUTES, help="route: ensemble or bls", default=None)
    parser.add_argument("--variant", default=None, help="a variant the pipeline serves")
    parser.add_argument("--reports-dir", type=Path, default=Path("reports"))
    parser.add_argument("--name", default="loadtest", help="report file prefix")
    for slo in ("p95-ms", "p99-ms", "min-rps", "max-fail-ratio"):
        parser.add_argument(f"--slo-{slo}", type=float, default=None)
    args, passthrough = parser.parse_known_args(argv)
    check_environment()  # what the locustfile reads, before the server starts
    exit_on_sigterm()

    args.reports_dir.mkdir(parents=True, exist_ok=True)
    prefix = args.reports_dir / args.name
    extra = ["--csv", str(prefix), "--html", f"{prefix}.html", *passthrough]
    for option in (
        "pipeline_name",
        "pipeline",
        "variant",
        "slo_p95_ms",
        "slo_p99_ms",
        "slo_min_rps",
    ):
        if getattr(args, option) is not None:
            extra += [f"--{option.replace('_', '-')}", str(getattr(args, option))]
    if args.slo_max_fail_ratio is not None:
        extra += ["--slo-max-fail-ratio", str(args.slo_max_fail_ratio)]
    if not args.url:  # the embedded server serves this repository: discover from it offline
        extra += ["--model-repository", str(args.model_repository)]
    locustfile, users = TASK_USERS[args.task]
    with target(args) as (http_url, grpc_url):
        command = locust_command(
            locustfile=locustfile,
            user_classes=users[args.protocol],
            host=f"http://{http_url}",
            users=args.users,
            duration_s=args.duration_s,
            extra=[*extra, "--grpc-url", grpc_url],
        )
        log.info("==> %s", " ".join(command))
        code = subprocess.call(command)
    log.info("==> reports: %s_stats.csv, %s.html (locust exit status %s)", prefix, prefix, code)
    return code


if __name__ == "__main__":
    raise SystemExit(run_main(main))
