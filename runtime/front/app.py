"""The front: the only listener unauthenticated clients reach; Triton itself listens on private
Unix sockets.

Triton 2.51 has no HTTP or gRPC input-size limit (its gRPC server accepts 2 GiB messages), inflates
``Content-Encoding: gzip`` bodies without a bound and parses JSON recursively (a body nested 1M
levels deep crashes it), and its ``--*-restricted-api`` keys can only be passed on the command line
(world-readable in ``/proc/PID/cmdline``). So ``tritonserver`` binds ``unix:`` sockets inside a
0700 directory, and this front, in the launcher's process, listens on the public HTTP and gRPC
ports and, before Triton parses anything:

- refuses bodies over ``max_body_bytes`` (HTTP 413 from the ``Content-Length`` alone, or while
  reading a chunked body; gRPC ``RESOURCE_EXHAUSTED`` from grpcio's own receive limit);
- inflates gzip/deflate bodies itself with the same bound (stops at ``max_body_bytes + 1``
  decompressed bytes, so a 2 MB zip bomb costs 2 MB) and forwards them uncompressed;
- refuses JSON nested deeper than ``max_json_depth`` (400);
- checks the admin key on the restricted APIs (model repository, config, shared memory,
  statistics, trace, logging) with a constant-time compare;
- answers every request: an upstream that is restarting, saturated or silent past
  ``request_timeout_s`` gets the client a 503 / ``UNAVAILABLE``, never a hang.

aiohttp and grpcio do the protocol work (both ship with tritonclient); the front adds a lookup,
a length check and a byte scan per request.

The pieces: :mod:`runtime.front.http` (the HTTP relay), :mod:`runtime.front.grpc` (the gRPC relay),
:mod:`runtime.front.body` (body bounds and checks), :mod:`runtime.front.guard` (header parsing,
stream admission, throttled log), :mod:`runtime.front.settings` (limits, sockets); this module
runs both relays (:class:`Front`) and is the sidecar's command line (:func:`main`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from aiohttp import web

from tritonforge.env import env_int
from tritonforge.headers import ADMIN_HEADER, GRPC_ADMIN_HEADER
from tritonforge.runtime.errors import ServerStartError
from tritonforge.runtime.front.grpc import (
    GrpcFront,
)
from tritonforge.runtime.front.guard import (
    Admission,
    ServerErrorLog,
    ThrottledLog,
)
from tritonforge.runtime.front.http import (
    SHUTTING_DOWN,
    HttpFront,
)
from tritonforge.runtime.front.settings import (
    OPENAI_KEY_ENV,
    FrontLimits,
    grpc_target,
    http_socket,
    openai_settings,
)
from tritonforge.runtime.tenants.gate import TenantGate
from tritonforge.runtime.tenants.grpc import TENANT_METADATA, admit_call, check_model
from tritonforge.runtime.tenants.http import TenantHttp

if TYPE_CHECKING:
    from tritonforge.runtime.front.settings import OpenAISettings


log = logging.getLogger(__name__)


class Front:
    """Both fronts on one asyncio loop in a daemon thread of the launcher.

    ``start()`` binds the public ports (raising :class:`ServerStartError` naming the flag when one is
    taken) before tritonserver starts; ``stop()`` closes them. The upstream paths are read per
    request, so a restarted tritonserver is picked up without rebinding.
    """

    def __init__(
        self,
        host: str,
        http_port: int,
        grpc_port: int,
        http_socket: Callable[[], Path],
        grpc_target: Callable[[], str],
        admin_key: str | None,
        admin_header: str,
        grpc_admin_headers: Iterable[str],
        limits: FrontLimits | None = None,
        openai: OpenAISettings | None = None,
        traced: bool = False,
        tenants: Path | None = None,
    ) -> None:
        self.host = host
        self.http_port = http_port
        self.grpc_port = grpc_port
        self.limits = limits or FrontLimits()
        self.admission = Admission(self.limits.max_open_streams)
        self.errors = ThrottledLog(log)
        self.http = HttpFront(
            http_socket,
            admin_key,
            admin_header.lower(),
            self.limits,
            self.admission,
            self.errors,
        )
        self.grpc = GrpcFront(
            grpc_target,
            admin_key,
            grpc_admin_headers,
            self.limits,
            self.admission,
            self.errors,
            pins=self.http.check_pin,
            traced=traced,
            served=self.http.stream_capacity,
            queues=self.http.queue_capacity.slot,
        )
        self.http.grpc_channel = self.grpc.channel
        if openai is not None:
            from tritonforge.runtime.front.openai.app import OpenAIFront

            self.http.openai = OpenAIFront(self.http, self.grpc.channel, openai)
        self.handler = self.http.handle
        self.tenants: TenantGate | None = None
        if tenants is not None:  # read now: a bad file stops the start, naming the field
            self.tenants = TenantGate(tenants)
            self.handler = TenantHttp(
                self.tenants, self.http.handle, admin_key, admin_header.lower(),
                self.limits.max_body_bytes,
            ).handle  # fmt: skip
            self.grpc.admit = functools.partial(admit_call, self.tenants)
            self.grpc.may_call = functools.partial(check_model, self.tenants)
            self.grpc.hidden = (*self.grpc.hidden, TENANT_METADATA)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="front", daemon=True)
        self._runner: web.ServerRunner | None = None
        self._grpc_server: grpc.aio.Server | None = None

    def start(self) -> Front:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        try:
            future.result(timeout=30)
        except BaseException:
            self.stop()
            raise
        return self

    async def _start(self) -> None:
        server = web.Server(
            self.handler,
            auto_decompress=False,
            keepalive_timeout=self.limits.idle_timeout_s,
            max_field_size=16384,
            logger=ServerErrorLog(self.errors),  # the parser's 400s: no traceback per request
        )
        self._runner = web.ServerRunner(server, handle_signals=False)
        await self._runner.setup()
        try:
            await web.TCPSite(
                self._runner,
                self.host,
                self.http_port,
                reuse_address=True,
                backlog=self.limits.listen_backlog_connections,
            ).start()
            self.http_port = int(self._runner.addresses[0][1])  # the bound one (0: any free)
        except OSError as e:
            raise ServerStartError(
                f"cannot listen on {self.host}:{self.http_port} for HTTP ({e.strerror}); pass "
                "--http-port or set TRITONFORGE_HTTP_PORT"
            ) from e
        self._grpc_server = grpc.aio.server(
            handlers=[self.grpc],
            options=[
                ("grpc.max_receive_message_length", self.limits.max_body_bytes),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0),
            ],
        )
        bound = 0
        with contextlib.suppress(RuntimeError):
            bound = self._grpc_server.add_insecure_port(f"{self.host}:{self.grpc_port}")
        if not bound:
            raise ServerStartError(
                f"cannot listen on {self.host}:{self.grpc_port} for gRPC (port taken?); pass "
                "--grpc-port or set TRITONFORGE_GRPC_PORT"
            )
        self.grpc_port = bound
        await self._grpc_server.start()

    async def _stop(self) -> None:
        self.errors.flush()
        if self._grpc_server is not None:
            await self._grpc_server.stop(grace=1.0)
        if self._runner is not None:
            await self._runner.cleanup()
        await self.http.close()
        await self.grpc.close()

    def release_upstream(self) -> None:
        """Close the idle keep-alive connections to tritonserver (they would hold its shutdown
        until ``--exit-timeout-secs``); new requests open fresh ones."""
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._release(), self._loop).result(timeout=5)

    async def _release(self) -> None:
        await self.http.close()
        self.grpc.detach(grace_s=self.limits.drain_grace_s)

    def begin_drain(self, reason: str = SHUTTING_DOWN) -> None:
        """Stop accepting: from now on every request gets 503 / UNAVAILABLE naming ``reason``
        (never reaching tritonserver, so never its NOT_FOUND of a model being unloaded), and
        every open stream ends with a last message saying why."""
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._begin_drain(reason), self._loop).result(5)

    async def _begin_drain(self, reason: str) -> None:
        self.admission.begin_drain(reason)

    def end_streams(
        self, models: Iterable[str], reason: str, opened_before_s: float | None = None
    ) -> int:
        """End the open streams to ``models`` (opened before ``opened_before_s``, monotonic,
        when given) with a last message saying ``reason`` (:meth:`Admission.end_streams`); how
        many. The supervisor calls it when a stub died: its decoupled requests never end."""
        if not self._thread.is_alive():
            return 0
        wanted = list(models)

        async def end() -> int:
            return self.admission.end_streams(wanted, reason, opened_before_s)

        with contextlib.suppress(Exception):
            return asyncio.run_coroutine_threadsafe(end(), self._loop).result(timeout=5)
        return 0

    def metrics(self) -> str:
        """The front's gauges in Prometheus text (appended to Triton's on the metrics port)."""
        tenants = self.tenants.metrics() if self.tenants is not None else ""
        return self.admission.metrics() + tenants

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is in flight through the front (short requests finished,
        streams ended); False at the timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self._thread.is_alive() or self.admission.idle():
                return True
            time.sleep(0.05)
        return self.admission.idle()

    def stop(self) -> None:
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=15)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        if not self._loop.is_running():
            self._loop.close()


def _true_or_false(value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise ValueError(f"true or false, not {value[:16]!r}")
    return value.lower() == "true"


def add_limits_arguments(parser: argparse.ArgumentParser) -> None:
    """One ``--<field>`` option per :class:`FrontLimits` field, its default the field's; a
    bool takes ``true`` or ``false`` (``type=bool`` would read "false" as True)."""
    for name, value in vars(FrontLimits()).items():
        flag = f"--{name.replace('_', '-')}"
        if isinstance(value, bool):
            parser.add_argument(flag, type=_true_or_false, default=value, metavar="true|false")
        else:
            parser.add_argument(flag, type=type(value), default=value)


def main(argv: list[str] | None = None) -> int:
    """``python -m tritonforge.runtime front``: the front alone, before a tritonserver started elsewhere with
    ``--http-address=unix:<dir>/http.sock --http-port=1 --grpc-address=unix:<dir>/grpc.sock
    --grpc-port=1`` (:func:`triton_listen_args`; a sidecar sharing ``<dir>``: docker-compose.yml,
    deploy/k8s). The admin key comes from the environment
    variable named by ``--admin-key-env`` (never from the command line)."""
    import os
    import signal

    p = argparse.ArgumentParser(
        prog="python -m tritonforge.runtime front", description=main.__doc__
    )
    p.add_argument("--host", default=os.environ.get("TRITONFORGE_HOST", "127.0.0.1"))
    p.add_argument("--http-port", type=int, default=env_int("TRITONFORGE_HTTP_PORT", 8000))
    p.add_argument("--grpc-port", type=int, default=env_int("TRITONFORGE_GRPC_PORT", 8001))
    p.add_argument("--socket-dir", type=Path, required=True, help="where Triton's sockets are")
    p.add_argument("--admin-key-env", default="TRITONFORGE_ADMIN_KEY")
    p.add_argument(
        "--model-repository",
        type=Path,
        default=os.environ.get("TRITONFORGE_MODEL_REPOSITORY"),
        help="the served repository (read-only): turns on the OpenAI-compatible /v1 routes",
    )
    p.add_argument(
        "--traced",
        type=_true_or_false,
        default=False,
        metavar="true|false",
        help="tritonserver exports OpenTelemetry spans (its --trace-config=mode=opentelemetry): "
        "each traced gRPC call gets its own upstream connection (GrpcFront.unary_channel)",
    )
    add_limits_arguments(p)
    args = p.parse_args(argv)
    import secrets

    given = os.environ.get(args.admin_key_env)
    key = given or secrets.token_urlsafe(18)  # no key set: nobody can call the admin APIs
    limits = FrontLimits(**{name: getattr(args, name) for name in vars(FrontLimits())})
    front = Front(
        args.host,
        args.http_port,
        args.grpc_port,
        http_socket=lambda: http_socket(args.socket_dir),
        grpc_target=lambda: grpc_target(args.socket_dir),
        admin_key=key,
        admin_header=ADMIN_HEADER,
        grpc_admin_headers=(GRPC_ADMIN_HEADER, ADMIN_HEADER),
        limits=limits,
        openai=openai_settings(args.model_repository, os.environ.get(OPENAI_KEY_ENV)),
        traced=args.traced,
    )
    try:
        front.start()
    except ServerStartError as e:
        log.error("%s", e)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    log.info(
        f"==> front on {args.host}: HTTP {front.http_port}, gRPC {front.grpc_port} -> "
        f"{args.socket_dir} (admin APIs {'need $' + args.admin_key_env if given else 'closed: no key set'})"
    )
    stop.wait()
    front.stop()
    return 0
