"""The composition root of the serving side: the launcher's tritonserver behind the public front.

The launcher (:mod:`runtime.launcher`) builds no front and the front (:mod:`runtime.front`) starts
no Triton; this module gives the launcher a factory of its front. The supervisor
(:mod:`runtime.supervisor`) is built beside them by ``serve`` (:mod:`runtime.cli.main`): it
watches the launcher and ends the front's streams through it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from tritonforge.headers import ADMIN_HEADER, GRPC_ADMIN_HEADER
from tritonforge.runtime.front.app import Front
from tritonforge.runtime.front.settings import openai_settings
from tritonforge.runtime.launcher.server import TritonLauncher
from tritonforge.runtime.launcher.settings import ServerSettings
from tritonforge.runtime.launcher.tracing import tracing_enabled


def build_front(server: TritonLauncher) -> Front:
    """The started front of ``server``: its public ports, relaying to its private sockets."""
    s = server.settings
    return Front(
        s.host,
        s.http_port,
        s.grpc_port,
        http_socket=lambda: server.http_socket,
        grpc_target=lambda: server.grpc_target,
        admin_key=s.admin_key if s.restrict_apis else None,
        admin_header=ADMIN_HEADER,
        grpc_admin_headers=(GRPC_ADMIN_HEADER, ADMIN_HEADER),
        limits=s.front_limits,
        openai=openai_settings(s.model_repository, s.openai_api_key) if s.openai else None,
        traced=tracing_enabled(s.extra_args),
        tenants=s.tenants_file,
    ).start()


class EmbeddedServer(TritonLauncher):
    """tritonserver behind the front (``settings.front``, the default): what ``serve`` runs and
    the context manager the tests use."""

    def __init__(self, settings: ServerSettings) -> None:
        super().__init__(settings, front=build_front)


@contextlib.contextmanager
def serving(model_repository: Path, **kwargs: object) -> Iterator[EmbeddedServer]:
    """Serve ``model_repository`` on free loopback ports for the duration of the block."""
    with EmbeddedServer(ServerSettings.ephemeral(model_repository, **kwargs)) as server:
        yield server
