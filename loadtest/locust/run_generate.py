"""``python -m tritonforge.loadtest.locust.run_generate``: a bounded headless Locust run of streaming generation
users with SLO gates (exit 1 naming each breach). Starts the embedded Triton with only the
``generate`` model unless ``--url`` names a running server. SLO flags pass through to
:mod:`loadtest.locust.generate` (``--slo-ttft-p95-ms`` ...)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

from tritonforge.client.settings import normalize_url
from tritonforge.loadtest.locust import GENERATE_LOCUSTFILE
from tritonforge.loadtest.locust.run import exit_on_sigterm, locust_command
from tritonforge.logs import run_main
from tritonforge.pipelines import generator_from_repository
from tritonforge.runtime.serving import serving

log = logging.getLogger(__name__)

LOCUSTFILE = GENERATE_LOCUSTFILE


@contextlib.contextmanager
def http_target(url: str | None, repo: Path) -> Iterator[str]:
    if url:
        yield normalize_url(url)
        return
    default = generator_from_repository(repo).model()
    log.info("==> starting the embedded Triton (%s only) on %s", default, repo)
    with serving(repo, model_control_mode="explicit", load_models=[default]) as server:
        yield server.http_url


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tritonforge.loadtest.locust.run_generate", description=__doc__
    )
    p.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    p.add_argument("--url", default=os.environ.get("TRITONFORGE_LOADTEST_URL") or None)
    p.add_argument("--users", type=int, default=4)
    p.add_argument(
        "--user-class",
        default="GenerateStreamUser",
        choices=["GenerateStreamUser", "OpenAIChatStreamUser"],
        help="v2 generate_stream, or OpenAI's /v1/chat/completions (stream: true)",
    )
    p.add_argument("--duration-s", type=float, default=30.0)
    p.add_argument("--reports-dir", type=Path, default=Path("reports"))
    args, passthrough = p.parse_known_args(argv)
    exit_on_sigterm()
    args.reports_dir.mkdir(parents=True, exist_ok=True)
    summary = args.reports_dir / "loadtest_generate.json"
    with http_target(args.url, args.model_repository) as http_url:
        command = locust_command(
            locustfile=LOCUSTFILE,
            user_classes=[args.user_class],
            host=f"http://{http_url}",
            users=args.users,
            duration_s=args.duration_s,
            extra=["--samples-out", str(summary), *passthrough],
        )
        log.info("==> %s", " ".join(command))
        code = subprocess.call(command)
    log.info("==> summary: %s (locust exit status %s)", summary, code)
    return code


if __name__ == "__main__":
    raise SystemExit(run_main(main))
