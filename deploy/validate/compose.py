"""``docker-compose.yml``: the Compose Specification schema after interpolation, and what this
project needs from it (GPU reservation, read-only repository, health checks, the front, drain)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tritonforge.deploy.validate.documents import (
    interpolate,
    load_schema,
    load_yaml,
    schema_errors,
    seconds,
    size_bytes,
    triton_flags,
)
from tritonforge.deploy.validate.launcher import (
    ADMIN_KEY_ENV,
    ADMIN_KEY_REF,
    DRAIN_MODULE,
    front_args,
    front_findings,
    stop_budget_s,
    triton_command,
)
from tritonforge.deploy.validate.paths import COMPOSE_FILE, PROJECT_ROOT, SCHEMA_DIR


def compose_document(path: Path = COMPOSE_FILE, env: Mapping[str, str] | None = None) -> Any:
    """The compose file after interpolation with ``env`` (defaults apply for unset variables;
    the admin key reads as ``$(TRITONFORGE_ADMIN_KEY)``, whatever its value)."""
    return interpolate(load_yaml(path), {**(env or {}), ADMIN_KEY_ENV: ADMIN_KEY_REF})


def validate_compose(path: Path = COMPOSE_FILE, env: Mapping[str, str] | None = None) -> list[str]:
    """Compose Specification schema errors of ``path`` (interpolated like ``docker compose config``)."""
    schema = load_schema(SCHEMA_DIR / "compose-spec.json")
    return schema_errors(compose_document(path, env), schema, path.name)


def compose_findings(doc: Mapping[str, Any], root: Path = PROJECT_ROOT) -> list[str]:
    """What this project needs from an (interpolated) compose document."""
    out: list[str] = []
    services: Mapping[str, Any] = doc.get("services") or {}
    triton = services.get("triton")
    if not triton:
        return ["compose: no `triton` service"]
    build = triton.get("build") or {}
    if build.get("dockerfile") != "deploy/Dockerfile":
        out.append("compose: triton must be built from deploy/Dockerfile")
    flags = triton_flags([str(a) for a in triton.get("command") or []])
    if flags.get("--model-control-mode") != "none":
        out.append("compose: triton needs --model-control-mode=none")
    if flags.get("--model-config-name") != "gpu":
        out.append("compose: --model-config-name must default to gpu")
    if flags.get("--model-repository") != "/models":
        out.append("compose: --model-repository must be /models (the mounted volume)")
    mounts = [v for v in triton.get("volumes") or [] if isinstance(v, dict)]
    repo_mounts = [v for v in mounts if v.get("target") == "/models"]
    if not repo_mounts or not all(v.get("read_only") for v in repo_mounts):
        out.append("compose: model_repository must be mounted read-only at /models")
    elif not (root / str(repo_mounts[0].get("source", ""))).resolve().is_relative_to(root):
        out.append("compose: the /models mount must come from the project's model_repository")
    published = {str(p).rsplit(":", 1)[-1] for p in triton.get("ports") or []}
    if published != {flags.get("--metrics-port")}:
        out.append(
            "compose: triton must publish only its --metrics-port (inference goes through the front)"
        )
    out += compose_front_findings(doc)
    if size_bytes(triton.get("shm_size", 0)) < 2**30:
        out.append("compose: shm_size must be at least 1gb for the Python backend")
    user = str(triton.get("user", "")).split(":")[0]
    if user in ("", "0", "root"):
        out.append("compose: triton must run as a non-root user")
    devices = (((triton.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get(
        "devices"
    ) or []
    if not any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices):
        out.append("compose: triton has no nvidia GPU reservation")
    command = [str(a) for a in triton.get("command") or []]
    if "run" not in command[:5] or DRAIN_MODULE not in command[:3]:
        out.append(f"compose: triton must run under `python3 -m {DRAIN_MODULE} run --` (drain)")
    else:
        grace = seconds(triton.get("stop_grace_period", "10s"))
        needed = stop_budget_s(command, flags)
        if grace < needed:
            out.append(f"compose: stop_grace_period {grace:g}s < drain + exit timeout {needed:g}s")
    for name, svc in services.items():
        for port in svc.get("ports") or [] if name in ("triton", "front") else []:
            if str(port).count(":") < 2 or str(port).startswith("0.0.0.0:"):
                out.append(
                    f"compose: port {port} must be published on a bind address (TRITON_BIND)"
                )
    for name in ("triton", "front"):
        test = " ".join(
            str(t) for t in ((services.get(name) or {}).get("healthcheck") or {}).get("test") or []
        )
        if "/v2/health/ready" not in test:
            out.append(f"compose: the {name} healthcheck must query /v2/health/ready")
    profiles: dict[str, set[str]] = {}
    for name, svc in services.items():
        for profile in svc.get("profiles") or []:
            profiles.setdefault(profile, set()).add(name)
    if not {"prometheus", "grafana"} <= profiles.get("monitoring", set()):
        out.append("compose: profile monitoring needs prometheus and grafana")
    if not {"locust-master", "locust-worker"} <= profiles.get("loadtest", set()):
        out.append("compose: profile loadtest needs locust-master and locust-worker")
    for name, svc in services.items():
        for vol in svc.get("volumes") or []:
            source = vol.get("source") if isinstance(vol, dict) else str(vol).split(":")[0]
            if source and str(source).startswith("./") and not (root / source).exists():
                out.append(f"compose: {name} mounts {source}, which does not exist")
    return out


def _compose_mounts(svc: Mapping[str, Any]) -> dict[str, tuple[str, bool]]:
    """Mount target -> (source, read-only) of every volume and bind of a compose service."""
    out: dict[str, tuple[str, bool]] = {}
    for vol in svc.get("volumes") or []:
        if isinstance(vol, dict):
            out[str(vol.get("target"))] = (str(vol.get("source")), bool(vol.get("read_only")))
        elif ":" in str(vol):
            source, target, *mode = str(vol).split(":")
            out[target] = (source, "ro" in mode)
    return out


def _compose_volume_sources(svc: Mapping[str, Any]) -> dict[str, str]:
    """Mount target -> named volume of a compose service (long and short syntax)."""
    out: dict[str, str] = {}
    for vol in svc.get("volumes") or []:
        if isinstance(vol, dict) and vol.get("type", "volume") == "volume":
            out[str(vol.get("target"))] = str(vol.get("source"))
        elif isinstance(vol, str) and not vol.startswith((".", "/")) and ":" in vol:
            source, target = vol.split(":")[:2]
            out[target] = source
    return out


def compose_front_findings(doc: Mapping[str, Any]) -> list[str]:
    """The ``front`` service: the only published inference ports, Triton's sockets shared through
    a private named volume, the key from its environment, stopped after triton (drain)."""
    services, volumes = doc.get("services") or {}, doc.get("volumes") or {}
    triton, front = services["triton"], services.get("front")
    if not front:
        return ["compose: no `front` service (runtime/front/app.py before Triton's sockets)"]
    command = [str(a) for a in front.get("command") or []]
    env = front.get("environment") or {}
    if isinstance(env, list):
        env = dict(str(e).partition("=")[::2] for e in env)
    t_vols, f_vols = _compose_volume_sources(triton), _compose_volume_sources(front)

    def shared(path: str) -> bool:
        return path in t_vols and t_vols[path] == f_vols.get(path)

    t_all, f_all = _compose_mounts(triton), _compose_mounts(front)

    def same_volume(path: str) -> bool:  # the same source, read-only in the front
        return (
            path in t_all and path in f_all and t_all[path][0] == f_all[path][0] and f_all[path][1]
        )

    out = front_findings(
        "compose",
        triton_command([str(a) for a in triton.get("command") or []]),
        command,
        shared,
        env.get(ADMIN_KEY_ENV) == ADMIN_KEY_REF,
        same_volume,
    )
    flags = triton_flags(front_args(command) or [])
    published = sorted(str(p).rsplit(":", 1)[-1] for p in front.get("ports") or [])
    want = sorted([flags.get("--http-port", ""), flags.get("--grpc-port", "")])
    if published != want:
        out.append(f"compose: the front must publish its --http-port and --grpc-port {want}")
    if flags.get("--host") != "0.0.0.0":
        out.append("compose: the front needs --host=0.0.0.0 (published ports reach the container)")
    if front.get("image") != triton.get("image"):
        out.append("compose: the front runs the triton image (deploy/Dockerfile)")
    if str(front.get("user", "")) != str(triton.get("user", "")):
        out.append("compose: the front must run as triton's user (the socket volume is 0700)")
    volume = (volumes.get(t_vols.get(flags.get("--socket-dir", ""), "")) or {}).get("driver_opts")
    o = set(str((volume or {}).get("o", "")).split(","))
    uid = str(triton.get("user", "")).split(":")[0]
    if not {"mode=0700", f"uid={uid}"} <= o:
        out.append(
            f"compose: the socket volume needs driver_opts o: uid={uid},mode=0700 (only the "
            "containers' user may connect to Triton's sockets)"
        )
    if "front" not in (triton.get("depends_on") or {}):
        out.append(
            "compose: triton must depend on the front (compose stops triton first, so in-flight "
            "requests drain through the front)"
        )
    if seconds(front.get("stop_grace_period", "10s")) < seconds(
        triton.get("stop_grace_period", "10s")
    ):
        out.append("compose: the front's stop_grace_period must be at least triton's")
    return out
