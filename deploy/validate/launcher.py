"""What the containers share with ``tritonforge serve``: the drain wrapper, the front before
Triton's sockets, restricted admin APIs keyed from the environment, OpenTelemetry tracing."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tritonforge.deploy.validate.documents import seconds, triton_flags
from tritonforge.runtime.launcher.settings import ADMIN_KEY_ENV

# What the admin key reads as after interpolation (compose) and in the Deployment's args (the
# kubelet expands it from the container's env): the files must take the key from the variable.
ADMIN_KEY_REF = f"$({ADMIN_KEY_ENV})"
DRAIN_MODULE = "tritonforge.drain"


def triton_command(command: list[str]) -> list[str]:
    """The ``tritonserver ...`` part of a container command (after the drain wrapper)."""
    return command[command.index("tritonserver") :] if "tritonserver" in command else command


RESTRICTED_FLAGS = ("--http-restricted-api", "--grpc-restricted-protocol")
FRONT_COMMAND = ["python3", "-m", "tritonforge.runtime", "front"]


def launcher_flag_findings(
    where: str, args: list[str], key: str, fronted: bool = False
) -> list[str]:
    """Restricted APIs and OpenTelemetry tracing (Triton's trace config as ``serve --trace-otlp``
    builds it). Before a front (``fronted``) Triton gets no restricted flags: the front checks the
    key, which must never be on a command line; otherwise the launcher's list and header, keyed by
    ``key``."""
    from tritonforge.headers import ADMIN_HEADER
    from tritonforge.runtime.launcher.command import RESTRICTED_APIS

    out: list[str] = []
    want = f"{','.join(RESTRICTED_APIS)}:{ADMIN_HEADER}={key}"
    for flag in RESTRICTED_FLAGS:
        values = [a.partition("=")[2] for a in args if a.startswith(flag + "=")]
        if fronted and values:
            out.append(
                f"{where}: tritonserver behind the front takes no {flag} (the front checks the "
                "admin key; on a command line it is world-readable)"
            )
        elif not fronted and values != [want]:
            out.append(
                f"{where}: needs {flag}={want} (the APIs and header of runtime.launcher.server)"
            )
    trace = [a.partition("=")[2] for a in args if a.startswith("--trace-config=")]
    if "mode=opentelemetry" not in trace:
        out.append(f"{where}: needs --trace-config=mode=opentelemetry")
    if not any(t.startswith("opentelemetry,url=") and t.endswith("/v1/traces") for t in trace):
        out.append(f"{where}: needs --trace-config=opentelemetry,url=<collector>/v1/traces")
    return out


def front_args(command: list[str]) -> list[str] | None:
    """The options of a ``python3 -m tritonforge.runtime front`` command line (None: not the front)."""
    if command[:4] != FRONT_COMMAND:
        return None
    return command[4:]


def front_findings(
    where: str,
    triton_args: list[str],
    front_command: list[str],
    shared: Callable[[str], bool],
    front_env_has_key: bool,
    same_volume: Callable[[str], bool] | None = None,
) -> list[str]:
    """What the front before tritonserver needs in a container deployment: Triton's HTTP/gRPC on
    ``unix:`` sockets in the front's ``--socket-dir`` (runtime.front.settings.triton_listen_args), that
    directory a volume both containers mount (``shared(dir)``), the admin key from the front's
    environment and not on any command line, no restricted flags on Triton; Triton's
    ``--model-repository`` given to the front too and mounted there from the same volume
    (``same_volume(path)``; the front's ``/v1`` routes read tokenizers and chat templates from
    it: without it ``/v1`` is off), and ``--traced=true`` when Triton exports OpenTelemetry
    spans (the front then gives each traced gRPC call its own upstream connection:
    ``GrpcFront.unary_channel``)."""
    from tritonforge.runtime.front.settings import triton_listen_args
    from tritonforge.runtime.launcher.tracing import tracing_enabled

    args = front_args(front_command)
    if args is None:
        return [f"{where}: the front must run `{' '.join(FRONT_COMMAND)}`"]
    flags = triton_flags(args)
    out: list[str] = []
    socket_dir = flags.get("--socket-dir")
    if not socket_dir:
        return [f"{where}: the front needs --socket-dir=<the shared socket volume>"]
    have = triton_flags(triton_args)
    for want in triton_listen_args(Path(socket_dir)):
        name, _, value = want.partition("=")
        if have.get(name) != value:
            out.append(
                f"{where}: tritonserver needs {want} (Unix sockets in the front's --socket-dir, "
                "runtime.front.settings.triton_listen_args)"
            )
    if not shared(socket_dir):
        out.append(f"{where}: {socket_dir} must be one volume mounted by both triton and the front")
    if flags.get("--admin-key-env", ADMIN_KEY_ENV) != ADMIN_KEY_ENV or not front_env_has_key:
        out.append(f"{where}: the front needs {ADMIN_KEY_ENV} in its environment")
    if any(ADMIN_KEY_REF in a or "admin-key=" in a for a in [*args, *triton_args]):
        out.append(f"{where}: the admin key must not be on a command line (world-readable)")
    repository = have.get("--model-repository")
    if repository and flags.get("--model-repository") != repository:
        out.append(
            f"{where}: the front needs --model-repository={repository} (tritonserver's; without "
            "it the OpenAI-compatible /v1 routes are off)"
        )
    elif repository and same_volume is not None and not same_volume(repository):
        out.append(
            f"{where}: the front must mount {repository} from tritonserver's model repository "
            "volume (read-only)"
        )
    if tracing_enabled(triton_args) and flags.get("--traced") != "true":
        out.append(
            f"{where}: tritonserver traces with OpenTelemetry: the front needs --traced=true (a "
            "traced gRPC call gets its own upstream connection; Triton 2.51 drops the "
            "traceparent of some calls on a shared one)"
        )
    out += launcher_flag_findings(where, triton_args, ADMIN_KEY_REF, fronted=True)
    return out


def drain_args(command: list[str]) -> dict[str, str]:
    """``--name=value`` options of a ``python3 -m tritonforge.drain`` command line."""
    if DRAIN_MODULE not in command:
        return {}
    head = command[command.index(DRAIN_MODULE) + 1 :]
    head = head[: head.index("--")] if "--" in head else head
    return triton_flags(head)


def pre_stop_command(container: Mapping[str, Any]) -> list[str]:
    """The exec command of a Kubernetes container's preStop hook ([] when it has none)."""
    hook = ((container.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}
    return [str(a) for a in hook.get("command") or []]


def stop_budget_s(drain_command: list[str], triton: Mapping[str, str]) -> float:
    """The longest a graceful stop takes: the drain's ``--timeout-s`` (default 20, see
    :mod:`tritonforge.drain`) plus tritonserver's ``--exit-timeout-secs`` (default 30)."""
    drain = drain_args(drain_command)
    return seconds(drain.get("--timeout-s", "20")) + seconds(
        triton.get("--exit-timeout-secs", "30")
    )
