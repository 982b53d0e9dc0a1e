"""Client settings (arguments win over ``TRITONFORGE_*`` environment variables).

Which Triton model serves which pipeline and variant is not here: it is discovered from the
server's model configs (:mod:`client.discovery`).

Environment variables: ``TRITONFORGE_URL`` (host:port, default ``localhost:8000`` for HTTP and
``localhost:8001`` for gRPC), ``TRITONFORGE_PROTOCOL`` (http|grpc), ``TRITONFORGE_TIMEOUT_S``,
``TRITONFORGE_MAX_ATTEMPTS``, ``TRITONFORGE_DEADLINE_S``, ``TRITONFORGE_VARIANT``,
``TRITONFORGE_PIPELINE`` (the route: ensemble|bls), ``TRITONFORGE_PIPELINE_NAME`` (default: the
discovered default pipeline of the task), ``TRITONFORGE_BATCH_SIZE``, ``TRITONFORGE_ADMIN_KEY``
(sent only to read the model configs), ``TRITONFORGE_MODEL_REPOSITORY`` (discover offline from
this repository), ``TRITONFORGE_BREAKER_FAILURES`` (consecutive transient failures that open the
circuit breaker; 0 turns it off), ``TRITONFORGE_BREAKER_WINDOW_S``,
``TRITONFORGE_BREAKER_COOLDOWN_S`` (:mod:`client.breaker`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from types import ModuleType
from typing import Any

from tritonforge.client.breaker import BreakerPolicy, CircuitBreaker
from tritonforge.client.discovery import (
    ADMIN_KEY_ENV,
    NAME_ENV,
    REPOSITORY_ENV,
    check_orchestration,
)
from tritonforge.client.errors import InvalidRequestError
from tritonforge.client.retry import RetryPolicy
from tritonforge.env import EnvironmentValueError, env_choice, env_float, env_int, env_str
from tritonforge.pipelines import ROUTES

PROTOCOLS = ("http", "grpc")
PIPELINES = ROUTES  # the old name of ROUTES
DEFAULT_HOST = "localhost"  # documented default; point TRITONFORGE_URL elsewhere
DEFAULT_PORTS = {"http": 8000, "grpc": 8001}


def _env(name: str) -> str | None:
    return env_str(name)


def _env_float(name: str, default: float) -> float:
    try:
        return env_float(name, default)
    except EnvironmentValueError as e:
        raise InvalidRequestError(str(e)) from e


def _env_choice(
    name: str, choices: tuple[str, ...], default: str, ignore_case: bool = False
) -> str:
    try:
        return env_choice(name, choices, default, ignore_case)
    except EnvironmentValueError as e:
        raise InvalidRequestError(str(e)) from e


def _env_int(name: str, default: int) -> int:
    try:
        return env_int(name, default)
    except EnvironmentValueError as e:
        raise InvalidRequestError(str(e)) from e


def normalize_url(url: str) -> str:
    """tritonclient wants ``host:port`` without a scheme: strip ``http://``/``grpc://``."""
    for scheme in ("http://", "https://", "grpc://"):
        if url.startswith(scheme):
            url = url[len(scheme) :]
    return url.rstrip("/")


@dataclass
class ClientSettings:
    """Where and how to call the server. Unset fields come from the environment."""

    protocol: str = field(
        default_factory=lambda: _env_choice(
            "TRITONFORGE_PROTOCOL", PROTOCOLS, "http", ignore_case=True
        )
    )
    url: str | None = None
    timeout_s: float = field(default_factory=lambda: _env_float("TRITONFORGE_TIMEOUT_S", 30.0))
    max_attempts: int = field(default_factory=lambda: _env_int("TRITONFORGE_MAX_ATTEMPTS", 4))
    deadline_s: float = field(default_factory=lambda: _env_float("TRITONFORGE_DEADLINE_S", 60.0))
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    # free text: the variants are discovered from the server and checked there
    variant: str = field(default_factory=lambda: _env("TRITONFORGE_VARIANT") or "fp32")
    # the orchestration route (ensemble | bls)
    route: str = field(
        default_factory=lambda: _env_choice("TRITONFORGE_PIPELINE", ROUTES, "ensemble")
    )
    batch_size: int = field(default_factory=lambda: _env_int("TRITONFORGE_BATCH_SIZE", 64))
    name: str | None = field(default_factory=lambda: _env(NAME_ENV))
    admin_key: str | None = field(default_factory=lambda: _env(ADMIN_KEY_ENV), repr=False)
    repository: str | None = field(default_factory=lambda: _env(REPOSITORY_ENV))
    breaker_failures: int = field(
        default_factory=lambda: _env_int("TRITONFORGE_BREAKER_FAILURES", 5)
    )
    breaker_window_s: float = field(
        default_factory=lambda: _env_float("TRITONFORGE_BREAKER_WINDOW_S", 10.0)
    )
    breaker_cooldown_s: float = field(
        default_factory=lambda: _env_float("TRITONFORGE_BREAKER_COOLDOWN_S", 5.0)
    )
    # the old name of ``route``: given, it sets ``route``; afterwards it reads as ``route``
    pipeline: str | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.protocol = self.protocol.lower()
        if self.protocol not in PROTOCOLS:
            raise InvalidRequestError(
                f"unknown protocol {self.protocol!r}; expected one of {PROTOCOLS}"
            )
        if self.url is None:
            self.url = _env("TRITONFORGE_URL") or f"{DEFAULT_HOST}:{DEFAULT_PORTS[self.protocol]}"
        self.url = normalize_url(self.url)
        if self.timeout_s <= 0:
            raise InvalidRequestError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.batch_size < 1:
            raise InvalidRequestError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.pipeline is not None and self.pipeline != self.route:
            self.route = self.pipeline
        check_orchestration(self.route)
        self.pipeline = self.route
        if not self.variant:
            raise InvalidRequestError("variant must be a non-empty variant name")
        try:
            self.breaker_policy()
        except ValueError as e:
            raise InvalidRequestError(f"circuit breaker settings: {e}") from e

    def fields(self) -> dict[str, Any]:
        """The fields a copy is made from (``pipeline``, the alias of ``route``, left out)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "pipeline"}

    def tritonclient_module(self) -> ModuleType:
        """``tritonclient.http`` or ``tritonclient.grpc``: the protocol's request types."""
        if self.protocol == "http":
            import tritonclient.http as http

            return http
        import tritonclient.grpc as grpc

        return grpc

    @property
    def address(self) -> str:
        assert self.url is not None
        return self.url

    def breaker_policy(self) -> BreakerPolicy:
        return BreakerPolicy(
            failure_threshold=self.breaker_failures,
            window_s=self.breaker_window_s,
            cooldown_s=self.breaker_cooldown_s,
        )

    def circuit_breaker(self) -> CircuitBreaker:
        """A breaker for this server (``protocol://address``), one per client."""
        return CircuitBreaker(f"{self.protocol}://{self.address}", self.breaker_policy())

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            max_attempts=self.max_attempts,
            initial_backoff_s=self.initial_backoff_s,
            max_backoff_s=self.max_backoff_s,
            deadline_s=self.deadline_s,
        )
