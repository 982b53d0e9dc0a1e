"""Command line of the embedded runtime."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from tritonforge.env import env_int
from tritonforge.headers import ADMIN_HEADER, GRPC_ADMIN_HEADER
from tritonforge.runtime.cli.serve_setup import DEFAULT_REPOSITORY, prepare_args
from tritonforge.runtime.cli.staged import (
    BackgroundExports,
    ExportJob,
    public_units,
    servable_models,
)
from tritonforge.runtime.errors import EmbeddedServerError, ServerStartError
from tritonforge.runtime.launcher.cache import CACHE_ENV, DEFAULT_CACHE_BYTES, cache_args
from tritonforge.runtime.launcher.settings import ServerSettings
from tritonforge.runtime.launcher.tracing import TRACE_ENV, TRACE_RATE_ENV, trace_args
from tritonforge.runtime.serving import EmbeddedServer
from tritonforge.runtime.supervisor.health import HealthEndpoint
from tritonforge.runtime.supervisor.supervisor import Supervisor

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_REPOSITORY", "main", "prepare_args"]  # prepare_args: tritonforge.cli's hook


def _server_args(p: argparse.ArgumentParser) -> None:
    defaults = ServerSettings(model_repository=DEFAULT_REPOSITORY)
    p.add_argument("--model-repository", type=Path, default=DEFAULT_REPOSITORY)
    p.add_argument("--host", default=defaults.host, help="bind address (default 127.0.0.1)")
    p.add_argument("--http-port", type=int, default=defaults.http_port)
    p.add_argument("--grpc-port", type=int, default=defaults.grpc_port)
    p.add_argument("--metrics-port", type=int, default=defaults.metrics_port)
    p.add_argument(
        "--model-control-mode",
        choices=["none", "explicit", "poll"],
        default="explicit",
        help="explicit (default; every model loaded at start): the supervisor reloads just the "
        "model whose stub crashed, the others keep serving; none: it restarts the whole server",
    )
    p.add_argument("--load-model", action="append", default=[], help="with explicit control")
    p.add_argument(
        "--background-export",
        action="append",
        default=[],
        metavar="ARGS",
        help="after Triton is up with the models that are complete, run `tritonforge export ARGS` "
        "(one shell-quoted string; repeatable, run in order) and load what each export completes "
        "(explicit model control); a failed export leaves the others serving",
    )
    p.add_argument("--ready-timeout-s", type=float, default=defaults.ready_timeout_s)
    p.add_argument("--exit-timeout-s", type=float, default=defaults.exit_timeout_s)
    p.add_argument("--log-verbose", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="do not echo the server log")
    p.add_argument(
        "--supervise",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="canary-check the public models and restart the server when the pipeline breaks",
    )
    p.add_argument(
        "--health-port",
        type=int,
        default=env_int("TRITONFORGE_HEALTH_PORT", 8003),
        help="pipeline-aware health endpoint (GET /health/pipeline); 0 picks a free port",
    )
    p.add_argument("--canary-interval-s", type=float, default=5.0)
    p.add_argument(
        "--drain-timeout-s",
        type=float,
        default=5.0,
        help="on SIGTERM, wait this long at most for in-flight requests before stopping Triton "
        "(new requests get 503 / UNAVAILABLE at once, open streams end with a last message)",
    )
    p.add_argument(
        "--trace-otlp",
        metavar="HOST:PORT",
        help=f"export OpenTelemetry traces (OTLP/HTTP) there; default ${TRACE_ENV} (off when unset)",
    )
    p.add_argument(
        "--trace-rate", type=int, help=f"trace one request in N (default ${TRACE_RATE_ENV} or 1)"
    )
    p.add_argument(
        "--cache-bytes",
        type=int,
        help=f"response cache size (default ${CACHE_ENV} or {DEFAULT_CACHE_BYTES}; 0 turns it off)",
    )
    p.add_argument(
        "--tenants",
        type=Path,
        help="a tenants file (TOML: keys stored hashed, allowed models, rates, quotas, "
        "priorities; docs/openai.md); re-read when it changes. Without it: no tenants",
    )
    p.add_argument(
        "--unrestricted",
        action="store_true",
        help="do not restrict the admin APIs (model-repository, config, shm, stats, trace, logging)",
    )


_SAME_NAMED = (
    "model_repository",
    "host",
    "http_port",
    "grpc_port",
    "metrics_port",
    "model_control_mode",
    "ready_timeout_s",
    "exit_timeout_s",
    "log_verbose",
)
"""The :class:`ServerSettings` fields taken as they are from the options of the same name."""


def _settings(args: argparse.Namespace, load_models: Sequence[str] | None = None) -> ServerSettings:
    """The server's settings; ``load_models`` (staged start): exactly those, none when empty."""
    return ServerSettings(
        **{name: getattr(args, name) for name in _SAME_NAMED},
        load_models=args.load_model if load_models is None else list(load_models),
        load_all=load_models is None,
        echo_log=not args.quiet,
        restrict_apis=not args.unrestricted,
        extra_args=[*trace_args(args.trace_otlp, args.trace_rate), *cache_args(args.cache_bytes)],
        tenants_file=getattr(args, "tenants", None),
    )


def _install_stop_handlers() -> threading.Event:
    """SIGINT/SIGTERM set the returned event (installed before the server starts, so a signal
    during start-up is not lost)."""
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        log.info("==> signal %s: stopping tritonserver", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return stop


def _bind_health(server: EmbeddedServer, args: argparse.Namespace) -> HealthEndpoint:
    """Bind the pipeline health endpoint (before Triton starts: a taken port fails at once)."""
    try:
        return HealthEndpoint(server, server.settings.host, args.health_port)
    except OSError as e:
        server.stop()  # nothing runs yet; removes its directories
        raise ServerStartError(
            f"cannot listen on {server.settings.host}:{args.health_port} for the pipeline health "
            f"endpoint ({e}); pass --health-port (0 picks a free port) or set "
            "TRITONFORGE_HEALTH_PORT"
        ) from e


def _public(repository: Path, models: Sequence[str]) -> list[str]:
    return [m for ms in public_units(repository, models).values() for m in ms]


def _supervise(
    server: EmbeddedServer,
    args: argparse.Namespace,
    endpoint: HealthEndpoint,
    background: BackgroundExports | None = None,
) -> HealthEndpoint:
    """Serve the pipeline health endpoint, with the supervisor behind it when asked; with
    ``background`` exports, the canaries cover what is loaded and grow as exports finish."""
    supervisor = None
    if args.supervise:
        supervisor = Supervisor(
            server,
            models=None
            if background is None
            else _public(server.settings.model_repository, background.loaded),
            canary_interval_s=args.canary_interval_s,
            on_restart=lambda why: log.info("==> supervisor: recovering (%s)", why),
        ).start()
    if background is not None:
        endpoint.builds = background
        if supervisor is not None:
            watch = supervisor
            repo = Path(server.settings.model_repository)
            background.on_models = lambda models: watch.add_models(_public(repo, models))
    endpoint.supervisor = supervisor
    endpoint.start()
    canaries = (
        (", ".join(supervisor.models) or "none loaded yet")
        if supervisor
        else "none: --no-supervise"
    )
    log.info("==> pipeline health: %s (canaries: %s)", endpoint.url, canaries)
    return endpoint


def _print_admin(server: EmbeddedServer) -> None:
    if server.settings.restrict_apis:
        log.info(
            f"==> admin APIs (repository, config, shm, stats, trace, logging) need the header "
            f"'{ADMIN_HEADER}: <key>' (gRPC: '{GRPC_ADMIN_HEADER}'); key from $TRITONFORGE_ADMIN_KEY "
            f"({'set' if os.environ.get('TRITONFORGE_ADMIN_KEY') else 'unset: a random key was used'})"
        )


def _wait_for_signal(
    server: EmbeddedServer,
    stop: threading.Event,
    endpoint: HealthEndpoint | None = None,
    drain_timeout_s: float = 0.0,
    background: BackgroundExports | None = None,
) -> int:
    """Serve until ``stop`` is set, then shut down gracefully: a background export is
    interrupted, the health endpoint turns 503
    and the supervisor stops, the front refuses new requests and ends open streams, in-flight
    requests finish (bounded by ``drain_timeout_s``), then Triton gets SIGTERM. Exit 0 only when
    tritonserver exited 0 and left nothing behind. Unsupervised, exit 1 if the server dies;
    supervised, the supervisor restarts it (on the same ports)."""
    supervised = endpoint is not None and endpoint.supervisor is not None
    while not stop.wait(0.5):
        if not supervised and server.returncode is not None and not server.restarting:
            log.error("tritonserver exited unexpectedly (%s)", server.returncode)
            if background is not None:
                background.stop()
            server.stop()
            if endpoint is not None:
                endpoint.stop()
            return 1
    began = time.monotonic()
    if background is not None:
        background.stop()
    if endpoint is not None:
        endpoint.draining.set()
        if endpoint.supervisor is not None:
            endpoint.supervisor.stop()  # first: nothing restarts or probes during the drain
    supervisor_s = time.monotonic() - began
    drained = server.drain_front(drain_timeout_s)
    drain_s = time.monotonic() - began - supervisor_s
    log.info(
        "==> %s in %.1f s (supervisor stopped in %.1f s); stopping tritonserver",
        "drained" if drained else "drain timed out",
        drain_s,
        supervisor_s,
    )
    code = server.stop()
    if endpoint is not None:
        endpoint.stop()
    leftovers = server.leftover_processes()
    log.info(
        "==> stopped %.1f s after the signal (tritonserver exit status %s; leftover processes: %s)",
        time.monotonic() - began,
        code,
        leftovers,
    )
    if code not in (0, None):
        log.error("tritonserver exited with status %s on shutdown", code)
    return 0 if code in (0, None) and not leftovers else 1


def _lint_ok(repository: Path) -> bool:
    """Run the repository lint; print the problems and return False when there are any."""
    from tritonforge.runtime.launcher.lint import lint_repository

    problems = lint_repository(repository)
    for problem in problems:
        log.error("lint: %s", problem)
    if problems:
        log.error(
            f"not starting: {len(problems)} problem(s) in {repository} "
            "(fix them, or run `make export` if encoders are missing)"
        )
    return not problems


def _staged(args: argparse.Namespace) -> tuple[list[ExportJob], list[str] | None]:
    """The background export jobs and the models to load at start (None: the whole repository,
    after the lint passed); raises :class:`ServerStartError` when they cannot be combined."""
    jobs = [ExportJob.parse(a) for a in args.background_export]
    if not jobs:
        return jobs, None
    if args.model_control_mode != "explicit":
        raise ServerStartError("--background-export needs --model-control-mode explicit")
    models, problems = servable_models(args.model_repository)
    for _, why in sorted(problems.items()):
        log.info("==> not loaded (yet: an export may complete it): %s", why[0])
    return jobs, models


def _start(
    args: argparse.Namespace, load_models: list[str] | None, stop: threading.Event
) -> tuple[EmbeddedServer, HealthEndpoint]:
    server = EmbeddedServer(_settings(args, load_models))
    endpoint = _bind_health(server, args)
    log.info(
        "==> starting Triton on %s (model repository %s%s)",
        args.host,
        args.model_repository,
        "" if load_models is None else f"; loading {len(load_models)} complete model(s)",
    )
    try:
        server.start()
        log.info(  # the bound ports (a port of 0 asks for any free one)
            "==> listening: HTTP %s gRPC %s metrics %s",
            server.http_url, server.grpc_url, server.metrics_url,
        )  # fmt: skip
        server.wait_ready(cancel=stop)
    except BaseException:
        endpoint.stop()
        raise
    return server, endpoint


def _background(
    server: EmbeddedServer,
    jobs: list[ExportJob],
    loaded: list[str],
    t0: float,
    on_up: Callable[[str, dict[str, list[str]]], None] | None = None,
) -> BackgroundExports | None:
    if not jobs:
        return None
    up = public_units(server.settings.model_repository, loaded)
    log.info(
        "==> serving now: %s; exporting in the background: %s",
        ", ".join(up) or "nothing yet",
        ", ".join(j.label for j in jobs),
    )
    for name in up:
        log.info("==> pipeline %s up after %.0f s (complete on disk)", name, time.monotonic() - t0)
    return BackgroundExports(server, jobs, loaded=loaded, on_up=on_up, t0=t0)


def cmd_serve(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    jobs, load_models = _staged(args)
    if load_models is None and not _lint_ok(args.model_repository):
        return 2
    stop = _install_stop_handlers()
    server, endpoint = _start(args, load_models, stop)
    if stop.is_set():
        endpoint.stop()
        return _wait_for_signal(server, stop)
    log.info(
        f"==> ready: HTTP http://{server.http_url}  gRPC {server.grpc_url}  "
        f"metrics {server.metrics_url}"
    )
    _print_admin(server)
    background = _background(server, jobs, load_models or [], t0)
    endpoint = _supervise(server, args, endpoint, background)
    if background is not None:
        background.start()
    return _wait_for_signal(server, stop, endpoint, args.drain_timeout_s, background)


def cmd_lint(args: argparse.Namespace) -> int:
    from tritonforge.runtime.launcher.lint import lint_repository

    problems = lint_repository(args.model_repository)
    for problem in problems:
        print(f"lint: {problem}", file=sys.stderr)
    if not problems:
        print(f"lint: {args.model_repository} OK")
    return 1 if problems else 0


def cmd_demo(args: argparse.Namespace) -> int:
    from tritonforge.runtime.cli.demo import run_demo

    t0 = time.monotonic()
    jobs, load_models = _staged(args)
    if not jobs:
        return _demo_all(args)
    stop = _install_stop_handlers()
    server, endpoint = _start(args, load_models, stop)
    if stop.is_set():
        endpoint.stop()
        return _wait_for_signal(server, stop)
    shown = threading.Lock()  # one pipeline's demo at a time
    demos: list[threading.Thread] = []

    def demo(units: dict[str, list[str]]) -> None:
        with shown:
            try:
                run_demo(server, only=list(units))
            except Exception as e:  # the demo failing must not stop the exports
                log.error("==> demo of %s failed: %s", ", ".join(units), e)

    def show(label: str, units: dict[str, list[str]]) -> None:
        """In its own thread: the next export starts at once."""
        demos.append(
            threading.Thread(target=demo, args=(units,), name=f"demo-{label}", daemon=True)
        )
        demos[-1].start()

    loaded = list(load_models or [])
    background = _background(server, jobs, loaded, t0, on_up=show)
    assert background is not None
    _print_admin(server)
    endpoint = _supervise(server, args, endpoint, background)
    background.start()
    show("", public_units(args.model_repository, loaded))
    log.info(
        f"==> serving: HTTP http://{server.http_url}  gRPC {server.grpc_url}  "
        f"metrics {server.metrics_url}  (Ctrl-C stops)"
    )
    if args.once:
        while not background.wait(0.5) and not stop.is_set():
            pass
        for thread in demos:
            thread.join()
        stop.set()
    return _wait_for_signal(server, stop, endpoint, args.drain_timeout_s, background)


def _demo_all(args: argparse.Namespace) -> int:
    """The demo of a complete repository (no background exports): lint, serve, show, serve."""
    from tritonforge.runtime.cli.demo import run_demo

    if not _lint_ok(args.model_repository):
        return 2
    stop = _install_stop_handlers()
    server = EmbeddedServer(_settings(args))
    server.start()
    server.wait_ready(cancel=stop)
    if stop.is_set():
        return _wait_for_signal(server, stop)
    run_demo(server)
    log.info(
        f"==> serving: HTTP http://{server.http_url}  gRPC {server.grpc_url}  "
        f"metrics {server.metrics_url}  (Ctrl-C stops)"
    )
    if args.once:
        server.stop()
        return 0
    _print_admin(server)
    endpoint = _bind_health(server, args)
    return _wait_for_signal(server, stop, _supervise(server, args, endpoint), args.drain_timeout_s)


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["front"]:  # the front alone, as a sidecar: its own flags
        from tritonforge.runtime.front.app import main as front_main

        return front_main(args_list[1:])
    parser = argparse.ArgumentParser(prog="python -m tritonforge.runtime", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model repository until SIGINT/SIGTERM")
    _server_args(serve)
    serve.set_defaults(func=cmd_serve)
    demo = sub.add_parser("demo", help="serve, show the pipeline answering, keep serving")
    _server_args(demo)
    demo.add_argument("--once", action="store_true", help="stop after the demo")
    demo.set_defaults(func=cmd_demo)
    lint = sub.add_parser("lint", help="check the model repository's configs")
    lint.add_argument("--model-repository", type=Path, default=DEFAULT_REPOSITORY)
    lint.set_defaults(func=cmd_lint)
    sub.add_parser("front", help="only the front, before a tritonserver on Unix sockets (sidecar)")
    args = parser.parse_args(args_list)
    try:
        return int(args.func(args))
    except EmbeddedServerError as e:
        log.error("%s", e)
        return 1
    except KeyboardInterrupt:
        return 130
