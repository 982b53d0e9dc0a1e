"""How to run tritonserver (:class:`ServerSettings`, defaults from ``TRITONFORGE_*`` variables),
and free ports for tests and benchmarks."""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tritonforge.env import env_int
from tritonforge.runtime.front.settings import OPENAI_KEY_ENV, FrontLimits

ADMIN_KEY_ENV = "TRITONFORGE_ADMIN_KEY"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class ServerSettings:
    """How to run tritonserver. Defaults come from ``TRITONFORGE_*`` environment variables."""

    model_repository: Path
    host: str = field(default_factory=lambda: os.environ.get("TRITONFORGE_HOST", "127.0.0.1"))
    http_port: int = field(default_factory=lambda: env_int("TRITONFORGE_HTTP_PORT", 8000))
    grpc_port: int = field(default_factory=lambda: env_int("TRITONFORGE_GRPC_PORT", 8001))
    metrics_port: int = field(default_factory=lambda: env_int("TRITONFORGE_METRICS_PORT", 8002))
    model_control_mode: str = "none"
    load_models: Sequence[str] = ()
    load_all: bool = True
    """With explicit control and no ``load_models``: load the whole repository at start (False:
    start with no model loaded; models then come up through the repository API)."""
    ready_timeout_s: float = 120.0
    exit_timeout_s: float = 30.0
    log_verbose: int = 0
    echo_log: bool = False
    model_config_name: str | None = None
    extra_args: Sequence[str] = ()
    backend_dir: Path | None = None
    restrict_apis: bool = True
    """Require the admin header for the model-repository, model-config, shared-memory, statistics,
    trace and logging APIs on both protocols (Triton 2.51 ``--*-restricted-api``)."""
    admin_key: str = field(
        default_factory=lambda: os.environ.get(ADMIN_KEY_ENV) or secrets.token_urlsafe(18)
    )
    front: bool = True
    """Triton listens on Unix sockets in a private (0700) directory; the front (runtime/front/app.py)
    owns the public HTTP/gRPC ports, bounds bodies and checks the admin key. False: Triton binds
    the TCP ports itself (no body bounds; the admin key goes on its command line)."""
    front_limits: FrontLimits = field(default_factory=FrontLimits)
    openai: bool = True
    """Serve the OpenAI-compatible ``/v1`` routes on the front's HTTP port (docs/openai.md)."""
    openai_api_key: str | None = field(default_factory=lambda: os.environ.get(OPENAI_KEY_ENV))
    """When set, ``/v1`` needs ``Authorization: Bearer <key>`` (default: $TRITONFORGE_OPENAI_API_KEY)."""
    tenants_file: Path | None = None
    """A tenants file (:mod:`runtime.tenants`): keys, models, rates, quotas, priorities per
    tenant on the front; None: no tenants (today's behaviour)."""
    private_shm: bool = True
    """Run tritonserver in its own mount namespace with a private 0700 tmpfs on /dev/shm (the
    Python backend creates its regions 0644, readable by every local user, whatever the umask);
    falls back to the host's /dev/shm, with a warning, where namespaces are not allowed."""
    shm_limit_bytes: int = field(
        default_factory=lambda: env_int("TRITONFORGE_SHM_LIMIT_BYTES", 1 << 30)
    )
    """Size of that tmpfs: the bound on all shared-memory regions together."""

    @classmethod
    def ephemeral(cls, model_repository: Path, **kwargs: object) -> ServerSettings:
        """Settings on free loopback ports, for tests and benchmarks. Behind the front, port 0:
        the launcher binds any free port itself and holds it (``start()`` writes the bound
        ports back here), so no other process can take it between picking and binding; without
        the front Triton binds them, so they are picked free here (racy, benchmarks only)."""
        for key in ("http_port", "grpc_port", "metrics_port"):
            kwargs.setdefault(key, 0 if kwargs.get("front", True) else free_port())
        return cls(model_repository=model_repository, host="127.0.0.1", **kwargs)  # type: ignore[arg-type]

    @property
    def client_host(self) -> str:
        """Where a local client connects: loopback when the server binds every interface."""
        return "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
