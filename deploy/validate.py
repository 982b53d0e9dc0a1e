"""Offline checks of the deployment files (no Docker engine, no cluster, no GPU needed).

Every check returns a list of findings (empty = fine) so that tests assert on them and
``python -m tritonforge.deploy.validate`` prints them all at once:

* ``docker-compose.yml`` against the vendored Compose Specification schema, after compose-style
  ``${VAR:-default}`` interpolation, plus what this project needs from it (GPU reservation,
  read-only model repository, health check, ``--model-control-mode=none``...).
* ``deploy/k8s`` (kustomize resources, followed recursively) against the vendored Kubernetes 1.31
  strict schemas, plus probes, GPU limits, non-root, read-only root filesystem and the HPA metric.
* ``deploy/kserve`` (ServingRuntime + InferenceService) against strict subsets of KServe's CRDs
  (``deploy/schemas/k8s/*kserve*``), plus the same flags as the Deployment, KServe's mount and
  ports, the runtime/format/protocol match and a storage URI naming the base's PVC.
* what the container shares with ``tritonforge serve``: restricted admin APIs keyed from the
  environment, drain before stop, OpenTelemetry trace flags.
* ``model_repository/*/configs/gpu.pbtxt`` against ``config.pbtxt`` and the ONNX graph.
* Pins of the container images' Python packages against ``constraints.txt``.
* Python 3.10 compatibility and imports of what runs inside the Triton container.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from tritonforge.deploy.names import manifest_name_findings

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEPLOY_DIR = PROJECT_ROOT / "deploy"
SCHEMA_DIR = DEPLOY_DIR / "schemas"
K8S_SCHEMA_DIR = SCHEMA_DIR / "k8s"
COMPOSE_FILE = PROJECT_ROOT / "docker-compose.yml"
K8S_DIR = DEPLOY_DIR / "k8s"
DOCKERFILE = DEPLOY_DIR / "Dockerfile"
TRITON_REQUIREMENTS = DEPLOY_DIR / "requirements-triton.txt"
LOADTEST_REQUIREMENTS = DEPLOY_DIR / "requirements-loadtest.txt"
CONSTRAINTS = PROJECT_ROOT / "constraints.txt"
MODEL_REPOSITORY = PROJECT_ROOT / "model_repository"
DASHBOARD = DEPLOY_DIR / "monitoring" / "grafana" / "dashboards" / "triton.json"
ADAPTER_RULES = K8S_DIR / "prometheus-adapter-rules.yaml"

# NGC container release -> Triton server version (NGC "Triton Inference Server Release Notes").
NGC_TRITON_RELEASES: dict[str, str] = {
    "24.06": "2.47.0",
    "24.07": "2.48.0",
    "24.08": "2.49.0",
    "24.09": "2.50.0",
    "24.10": "2.51.0",
    "24.11": "2.52.0",
    "24.12": "2.53.0",
    "25.01": "2.54.0",
}
# The Triton container's interpreter (Ubuntu 22.04 in the 24.xx releases).
CONTAINER_PYTHON = (3, 10)
# stdlib names new in 3.11 (module or attribute) that would break on the container's 3.10.
PY311_ONLY = {"tomllib", "StrEnum", "TaskGroup", "ExceptionGroup", "Self", "LiteralString",
              "Never", "assert_never", "reveal_type", "UTC"}  # fmt: skip
# Pins of the Triton image that cannot equal the lock file, which is resolved on the venv's Python
# 3.11: name -> the container's (3.10) version. multidict 7.2 requires Python >= 3.11.
CONTAINER_PINS: dict[str, str] = {"multidict": "7.1.0"}
# Import names of the image's pins that differ from the package name.
IMPORT_NAMES = frozenset({"grpc", "google", "attr", "rapidjson"})
# Kubernetes (apiVersion, kind) -> vendored schema file under deploy/schemas/k8s/.
K8S_SCHEMAS: dict[tuple[str, str], str] = {
    ("apps/v1", "Deployment"): "v1.31.0/deployment-apps-v1.json",
    ("v1", "Service"): "v1.31.0/service-v1.json",
    ("v1", "PersistentVolumeClaim"): "v1.31.0/persistentvolumeclaim-v1.json",
    (
        "autoscaling/v2",
        "HorizontalPodAutoscaler",
    ): "v1.31.0/horizontalpodautoscaler-autoscaling-v2.json",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor-monitoring-v1.json",
    (
        "serving.kserve.io/v1alpha1",
        "ServingRuntime",
    ): "servingruntime-serving.kserve.io-v1alpha1.json",
    (
        "serving.kserve.io/v1beta1",
        "InferenceService",
    ): "inferenceservice-serving.kserve.io-v1beta1.json",
}
KSERVE_DIR = DEPLOY_DIR / "kserve"
# KServe's conventions: the storage initializer mounts the model at /mnt/models; HTTP on 8080.
KSERVE_MODEL_DIR = "/mnt/models"
KSERVE_HTTP_PORT = "8080"
# Flags that legitimately differ between the KServe runtime and the Deployment.
# KServe routes its ports straight to tritonserver (no front, docs/deploy.md): TCP listeners and
# the restricted-API flags instead of the Deployment's Unix sockets.
KSERVE_OWN_FLAGS = (
    "--model-repository",
    "--http-port",
    "--grpc-port",
    "--http-address",
    "--grpc-address",
    "--http-restricted-api",
    "--grpc-restricted-protocol",
)
# onnxruntime backend accelerators (Triton onnxruntime_backend README) and TensorRT precisions.
GPU_ACCELERATORS = {"tensorrt", "cuda"}
TRT_PRECISIONS = {"FP32", "FP16", "INT8"}
METRIC_NAME = re.compile(r"\b(nv_[a-z_]+)\b")
_VAR = re.compile(r"\$(?:\$|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\})")


class DeployCheckError(RuntimeError):
    """A deployment file is missing or cannot be read at all."""


# -- helpers ---------------------------------------------------------------------------------------
def load_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise DeployCheckError(f"cannot read {path}: {e}") from e


def load_yaml_all(path: Path) -> list[Any]:
    try:
        return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except (OSError, yaml.YAMLError) as e:
        raise DeployCheckError(f"cannot read {path}: {e}") from e


def interpolate(node: Any, env: Mapping[str, str]) -> Any:
    """Compose-style variable substitution (``$VAR`` unbraced is not supported; ``$$`` escapes)."""
    if isinstance(node, dict):
        return {k: interpolate(v, env) for k, v in node.items()}
    if isinstance(node, list):
        return [interpolate(v, env) for v in node]
    if not isinstance(node, str):
        return node

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, arg = m.group("name"), m.group("op"), m.group("arg") or ""
        value = env.get(name)
        if op in (":-", ":?") and not value:
            value = None
        if value is None:
            if op in (":?", "?"):
                raise DeployCheckError(f"required variable {name} is not set: {arg}")
            return arg if op in (":-", "-") else ""
        return value

    return _VAR.sub(sub, node)


def _schema_errors(instance: Any, schema: Mapping[str, Any], where: str) -> list[str]:
    validator = jsonschema.Draft202012Validator(schema)
    return [
        f"{where}: {'/'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
        for e in sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))
    ]


def _load_schema(path: Path) -> dict[str, Any]:
    try:
        schema: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise DeployCheckError(
            f"vendored schema {path} is missing or broken; see deploy/schemas/README.md"
        ) from e
    return schema


def triton_flags(args: list[str]) -> dict[str, str]:
    """``--name=value`` arguments as a dict (the last occurrence wins, as in tritonserver)."""
    flags: dict[str, str] = {}
    for arg in args:
        if arg.startswith("--"):
            name, _, value = arg.partition("=")
            flags[name] = value
    return flags


def _size_bytes(value: str | int) -> int:
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"(\d+)\s*([kmg]?)b?", value.strip().lower())
    if not m:
        raise DeployCheckError(f"cannot read the size {value!r}")
    return int(m.group(1)) * {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[m.group(2)]


# -- what the container shares with `tritonforge serve` -------------------------------------------
ADMIN_KEY_ENV = "TRITONFORGE_ADMIN_KEY"
# What the admin key reads as after interpolation (compose) and in the Deployment's args (the
# kubelet expands it from the container's env): the files must take the key from the variable.
ADMIN_KEY_REF = f"$({ADMIN_KEY_ENV})"
DRAIN_MODULE = "tritonforge.drain"


def triton_command(command: list[str]) -> list[str]:
    """The ``tritonserver ...`` part of a container command (after the drain wrapper)."""
    return command[command.index("tritonserver") :] if "tritonserver" in command else command


def _seconds(value: str | int | float) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)?", str(value).strip())
    if not m:
        raise DeployCheckError(f"cannot read the duration {value!r}")
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, None: 1}[m.group(2)]


RESTRICTED_FLAGS = ("--http-restricted-api", "--grpc-restricted-protocol")
FRONT_COMMAND = ["python3", "-m", "tritonforge.runtime", "front"]
# The package's old top-level and its namespaced name (tools/namespace_imports.py): both import
# in the image (tritonforge/runtime is a link to runtime/), so either may name the front.
FRONT_MODULES = ("runtime", "tritonforge.runtime")


def launcher_flag_findings(
    where: str, args: list[str], key: str, fronted: bool = False
) -> list[str]:
    """Restricted APIs and OpenTelemetry tracing (Triton's trace config as ``serve --trace-otlp``
    builds it). Before a front (``fronted``) Triton gets no restricted flags: the front checks the
    key, which must never be on a command line; otherwise the launcher's list and header, keyed by
    ``key``."""
    from tritonforge.runtime.server import ADMIN_HEADER, RESTRICTED_APIS

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
            out.append(f"{where}: needs {flag}={want} (the APIs and header of runtime.server)")
    trace = [a.partition("=")[2] for a in args if a.startswith("--trace-config=")]
    if "mode=opentelemetry" not in trace:
        out.append(f"{where}: needs --trace-config=mode=opentelemetry")
    if not any(t.startswith("opentelemetry,url=") and t.endswith("/v1/traces") for t in trace):
        out.append(f"{where}: needs --trace-config=opentelemetry,url=<collector>/v1/traces")
    return out


def front_args(command: list[str]) -> list[str] | None:
    """The options of a ``python3 -m tritonforge.runtime front`` command line (None: not the front)."""
    head = [*FRONT_COMMAND[:2], command[2] if len(command) > 2 else "", *FRONT_COMMAND[3:]]
    if command[:4] != head or head[2] not in FRONT_MODULES:
        return None
    return command[4:]


def front_findings(
    where: str,
    triton_args: list[str],
    front_command: list[str],
    shared: Callable[[str], bool],
    front_env_has_key: bool,
) -> list[str]:
    """What the front before tritonserver needs in a container deployment: Triton's HTTP/gRPC on
    ``unix:`` sockets in the front's ``--socket-dir`` (runtime.front.triton_listen_args), that
    directory a volume both containers mount (``shared(dir)``), the admin key from the front's
    environment and not on any command line, no restricted flags on Triton."""
    from tritonforge.runtime.front import triton_listen_args

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
                "runtime.front.triton_listen_args)"
            )
    if not shared(socket_dir):
        out.append(f"{where}: {socket_dir} must be one volume mounted by both triton and the front")
    if flags.get("--admin-key-env", ADMIN_KEY_ENV) != ADMIN_KEY_ENV or not front_env_has_key:
        out.append(f"{where}: the front needs {ADMIN_KEY_ENV} in its environment")
    if any(ADMIN_KEY_REF in a or "admin-key=" in a for a in [*args, *triton_args]):
        out.append(f"{where}: the admin key must not be on a command line (world-readable)")
    out += launcher_flag_findings(where, triton_args, ADMIN_KEY_REF, fronted=True)
    return out


def drain_args(command: list[str]) -> dict[str, str]:
    """``--name=value`` options of a ``python3 -m tritonforge.drain`` command line."""
    if DRAIN_MODULE not in command:
        return {}
    head = command[command.index(DRAIN_MODULE) + 1 :]
    head = head[: head.index("--")] if "--" in head else head
    return triton_flags(head)


# -- docker compose -------------------------------------------------------------------------------
def compose_document(path: Path = COMPOSE_FILE, env: Mapping[str, str] | None = None) -> Any:
    """The compose file after interpolation with ``env`` (defaults apply for unset variables;
    the admin key reads as ``$(TRITONFORGE_ADMIN_KEY)``, whatever its value)."""
    return interpolate(load_yaml(path), {**(env or {}), ADMIN_KEY_ENV: ADMIN_KEY_REF})


def validate_compose(path: Path = COMPOSE_FILE, env: Mapping[str, str] | None = None) -> list[str]:
    """Compose Specification schema errors of ``path`` (interpolated like ``docker compose config``)."""
    schema = _load_schema(SCHEMA_DIR / "compose-spec.json")
    return _schema_errors(compose_document(path, env), schema, path.name)


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
    if _size_bytes(triton.get("shm_size", 0)) < 2**30:
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
    drain = drain_args(command)
    if "run" not in command[:5] or DRAIN_MODULE not in command[:3]:
        out.append(f"compose: triton must run under `python3 -m {DRAIN_MODULE} run --` (drain)")
    else:
        grace = _seconds(triton.get("stop_grace_period", "10s"))
        needed = _seconds(drain.get("--timeout-s", "20")) + _seconds(
            flags.get("--exit-timeout-secs", "30")
        )
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
        return ["compose: no `front` service (runtime/front.py before Triton's sockets)"]
    command = [str(a) for a in front.get("command") or []]
    env = front.get("environment") or {}
    if isinstance(env, list):
        env = dict(str(e).partition("=")[::2] for e in env)
    t_vols, f_vols = _compose_volume_sources(triton), _compose_volume_sources(front)

    def shared(path: str) -> bool:
        return path in t_vols and t_vols[path] == f_vols.get(path)

    out = front_findings(
        "compose",
        triton_command([str(a) for a in triton.get("command") or []]),
        command,
        shared,
        env.get(ADMIN_KEY_ENV) == ADMIN_KEY_REF,
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
    if _seconds(front.get("stop_grace_period", "10s")) < _seconds(
        triton.get("stop_grace_period", "10s")
    ):
        out.append("compose: the front's stop_grace_period must be at least triton's")
    return out


# -- kubernetes -----------------------------------------------------------------------------------
def kustomize_documents(directory: Path = K8S_DIR) -> list[dict[str, Any]]:
    """The documents a ``kubectl apply -k directory`` would send (resources followed recursively)."""
    kfile = directory / "kustomization.yaml"
    if not kfile.exists():
        raise DeployCheckError(f"{directory} has no kustomization.yaml")
    docs: list[dict[str, Any]] = []
    for res in load_yaml(kfile).get("resources") or []:
        path = (directory / res).resolve()
        if path.is_dir():
            docs += kustomize_documents(path)
        elif path.exists():
            docs += [dict(d, __file__=str(path)) for d in load_yaml_all(path)]
        else:
            raise DeployCheckError(f"{kfile}: resource {res} does not exist")
    return docs


def validate_k8s(docs: list[dict[str, Any]]) -> list[str]:
    """Schema errors of each document (strict: unknown fields are errors)."""
    out: list[str] = []
    for doc in docs:
        body = {k: v for k, v in doc.items() if k != "__file__"}
        where = f"{Path(doc.get('__file__', '?')).name} {body.get('kind')}"
        key = (str(body.get("apiVersion")), str(body.get("kind")))
        if key not in K8S_SCHEMAS:
            out.append(f"{where}: no vendored schema for {key}; add it to K8S_SCHEMAS")
            continue
        out += _schema_errors(body, _load_schema(K8S_SCHEMA_DIR / K8S_SCHEMAS[key]), where)
    return out


def _by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def k8s_findings(docs: list[dict[str, Any]], adapter_rules: Path = ADAPTER_RULES) -> list[str]:
    """What this project needs from the manifests beyond their schemas."""
    out: list[str] = []
    deployments = _by_kind(docs, "Deployment")
    if len(deployments) != 1:
        return [f"k8s: expected one Deployment, found {len(deployments)}"]
    dep = deployments[0]
    pod = dep["spec"]["template"]["spec"]
    labels = dep["spec"]["template"]["metadata"].get("labels", {})
    containers = {c["name"]: c for c in pod["containers"]}
    triton = containers.get("triton")
    if triton is None:
        return ["k8s: the Deployment has no container named triton"]
    flags = triton_flags(triton.get("args", []))
    for flag, want in [
        ("--model-config-name", "gpu"),
        ("--model-control-mode", "none"),
        ("--model-repository", "/models"),
    ]:
        if flags.get(flag) != want:
            out.append(f"k8s: triton needs {flag}={want}")
    front = containers.get("front")
    if front is None:
        return ["k8s: the Deployment has no `front` container (runtime/front.py before Triton)"]
    out += k8s_front_findings(pod, triton, front)
    front_flags = triton_flags(
        front_args([*front.get("command", []), *front.get("args", [])]) or []
    )
    # liveness: /v2/health/live, or (better, server#8604) an exec canary inference
    liveness = triton.get("livenessProbe") or {}
    canary = " ".join(str(a) for a in (liveness.get("exec") or {}).get("command", []))
    if (liveness.get("httpGet") or {}).get("path") != "/v2/health/live" and not (
        "/infer" in canary or "tritonforge.canary" in canary
    ):
        out.append("k8s: livenessProbe must GET /v2/health/live or run a canary inference")
    pre_stop = (((triton.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}).get(
        "command"
    ) or []
    if DRAIN_MODULE not in pre_stop or "wait" not in pre_stop:
        out.append(
            f"k8s: triton needs a preStop hook running `python3 -m {DRAIN_MODULE} wait` "
            "(drain before SIGTERM, server#6287)"
        )
    else:
        drain = drain_args([str(a) for a in pre_stop])
        needed = _seconds(drain.get("--timeout-s", "20")) + _seconds(
            flags.get("--exit-timeout-secs", "30")
        )
        if float(pod.get("terminationGracePeriodSeconds", 30)) < needed:
            out.append(
                f"k8s: terminationGracePeriodSeconds < preStop drain + exit timeout ({needed:g})"
            )
    startup_grpc = (triton.get("startupProbe") or {}).get("grpc") or {}
    if startup_grpc and str(startup_grpc.get("port")) != front_flags.get("--grpc-port"):
        out.append(
            "k8s: the gRPC startup probe must use the front's --grpc-port (grpc.health.v1 passes "
            "through the front)"
        )
    limits = (triton.get("resources") or {}).get("limits") or {}
    if int(limits.get("nvidia.com/gpu", 0)) < 1:
        out.append("k8s: triton needs an nvidia.com/gpu limit")
    if "memory" not in limits:
        out.append("k8s: triton needs a memory limit")
    pod_sc, ctr_sc = pod.get("securityContext") or {}, triton.get("securityContext") or {}
    if not (pod_sc.get("runAsNonRoot") or ctr_sc.get("runAsNonRoot")):
        out.append("k8s: runAsNonRoot is not set")
    if not ctr_sc.get("readOnlyRootFilesystem"):
        out.append("k8s: readOnlyRootFilesystem is not set")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = {m["mountPath"]: m for m in triton.get("volumeMounts", [])}
    for path, medium in [("/tmp", None), ("/dev/shm", "Memory")]:
        vol = volumes.get(mounts[path]["name"]) if path in mounts else None
        if vol is None or "emptyDir" not in vol or (vol["emptyDir"] or {}).get("medium") != medium:
            out.append(
                f"k8s: {path} needs an emptyDir" + (f" with medium {medium}" if medium else "")
            )
    repo = mounts.get("/models")
    repo_vol = volumes.get(repo["name"]) if repo else None
    if (
        not repo
        or not repo.get("readOnly")
        or not repo_vol
        or "persistentVolumeClaim" not in repo_vol
    ):
        out.append("k8s: /models must be a read-only mount of a PersistentVolumeClaim")
    elif repo_vol["persistentVolumeClaim"]["claimName"] not in {
        d["metadata"]["name"] for d in _by_kind(docs, "PersistentVolumeClaim")
    }:
        out.append("k8s: the model repository's PVC is not among the manifests")
    for svc in _by_kind(docs, "Service"):
        selector = svc["spec"].get("selector", {})
        if not selector or any(labels.get(k) != v for k, v in selector.items()):
            out.append(f"k8s: Service {svc['metadata']['name']} does not select the Triton pods")
    hpas = _by_kind(docs, "HorizontalPodAutoscaler")
    if len(hpas) != 1:
        out.append(f"k8s: expected one HorizontalPodAutoscaler, found {len(hpas)}")
    else:
        hpa = hpas[0]["spec"]
        if hpa["scaleTargetRef"]["name"] != dep["metadata"]["name"]:
            out.append("k8s: the HPA does not target the Triton Deployment")
        served = adapter_metric_aliases(adapter_rules)
        for metric in hpa.get("metrics", []):
            if metric["type"] == "Pods" and metric["pods"]["metric"]["name"] not in served:
                out.append(
                    f"k8s: HPA metric {metric['pods']['metric']['name']} is not served by any "
                    f"rule in {adapter_rules.name}"
                )
    return out


def k8s_front_findings(
    pod: Mapping[str, Any], triton: Mapping[str, Any], front: Mapping[str, Any]
) -> list[str]:
    """The front sidecar: Triton's sockets in an emptyDir both containers mount, the only
    inference container ports, the readiness probe, the key from a Secret, drain before stop."""
    command = [str(a) for a in [*front.get("command", []), *front.get("args", [])]]
    env = {e["name"]: e for e in front.get("env", [])}
    from_secret = "secretKeyRef" in (env.get(ADMIN_KEY_ENV, {}).get("valueFrom") or {})
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    t_mounts = {m["mountPath"]: m["name"] for m in triton.get("volumeMounts", [])}
    f_mounts = {m["mountPath"]: m["name"] for m in front.get("volumeMounts", [])}

    def shared(path: str) -> bool:
        name = t_mounts.get(path)
        return name is not None and name == f_mounts.get(path) and "emptyDir" in volumes[name]

    out = front_findings(
        "k8s", [str(a) for a in triton.get("args", [])], command, shared, from_secret
    )
    if not from_secret:
        out.append(f"k8s: {ADMIN_KEY_ENV} must come from a Secret (valueFrom.secretKeyRef)")
    flags = triton_flags(front_args(command) or [])
    ports = {p["name"]: str(p["containerPort"]) for p in front.get("ports", [])}
    if ports != {"http": flags.get("--http-port"), "grpc": flags.get("--grpc-port")}:
        out.append("k8s: the front's ports http/grpc must be its --http-port/--grpc-port")
    if {p["name"] for p in triton.get("ports", [])} & {"http", "grpc"}:
        out.append("k8s: only the front has http/grpc container ports (Triton is on sockets)")
    if flags.get("--host") != "0.0.0.0":
        out.append("k8s: the front needs --host=0.0.0.0 (the Service reaches the pod IP)")
    if ((front.get("readinessProbe") or {}).get("httpGet") or {}).get("path") != "/v2/health/ready":
        out.append("k8s: the front's readinessProbe must GET /v2/health/ready")
    pre_stop = (((front.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}).get(
        "command"
    ) or []
    if DRAIN_MODULE not in pre_stop:
        out.append(
            f"k8s: the front needs a preStop `python3 -m {DRAIN_MODULE} wait` (it must forward "
            "while triton drains)"
        )
    if front.get("image") != triton.get("image"):
        out.append("k8s: the front runs the triton image (deploy/Dockerfile)")
    if not (front.get("securityContext") or {}).get("readOnlyRootFilesystem"):
        out.append("k8s: the front needs readOnlyRootFilesystem")
    return out


def kserve_findings(docs: list[dict[str, Any]], base: list[dict[str, Any]]) -> list[str]:
    """The KServe runtime serves the model repository like the Deployment of ``base``."""
    runtimes, services = _by_kind(docs, "ServingRuntime"), _by_kind(docs, "InferenceService")
    if len(runtimes) != 1 or len(services) != 1:
        return ["kserve: expected one ServingRuntime and one InferenceService"]
    runtime, isvc = runtimes[0], services[0]
    out: list[str] = []
    (ctr,) = runtime["spec"]["containers"][:1] or [{}]
    args = [str(a) for a in ctr.get("args", [])]
    flags = triton_flags(args)
    dep = _by_kind(base, "Deployment")[0]["spec"]["template"]["spec"]
    dep_args = [str(a) for a in dep["containers"][0].get("args", [])]
    own = [a for a in args if not a.startswith(KSERVE_OWN_FLAGS)]
    if own != [a for a in dep_args if not a.startswith(KSERVE_OWN_FLAGS)]:
        out.append("kserve: the runtime's tritonserver flags differ from deploy/k8s's Deployment")
    if flags.get("--model-repository") != KSERVE_MODEL_DIR:
        out.append(f"kserve: --model-repository must be {KSERVE_MODEL_DIR} (KServe's mount)")
    if flags.get("--http-port") != KSERVE_HTTP_PORT:
        out.append(f"kserve: --http-port must be {KSERVE_HTTP_PORT} (KServe routes HTTP there)")
    grpc_ports = [str(p["containerPort"]) for p in ctr.get("ports", []) if p.get("name") == "h2c"]
    if grpc_ports != [flags.get("--grpc-port")]:
        out.append("kserve: the h2c container port must be --grpc-port")
    if int(((ctr.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0)) < 1:
        out.append("kserve: the runtime needs an nvidia.com/gpu limit")
    pre_stop = (((ctr.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}).get(
        "command"
    ) or []
    if DRAIN_MODULE not in pre_stop:
        out.append(f"kserve: the runtime needs a preStop `python3 -m {DRAIN_MODULE} wait`")
    spec = isvc["spec"]["predictor"]
    model = spec["model"]
    if model.get("runtime") != runtime["metadata"]["name"]:
        out.append("kserve: the InferenceService does not name the ServingRuntime")
    formats = {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    if model["modelFormat"]["name"] not in formats:
        out.append("kserve: the InferenceService's modelFormat is not supported by the runtime")
    if model.get("protocolVersion", "v1") not in runtime["spec"].get("protocolVersions", []):
        out.append("kserve: the InferenceService's protocolVersion is not the runtime's")
    uri = str(model.get("storageUri", ""))
    claims = {d["metadata"]["name"] for d in _by_kind(base, "PersistentVolumeClaim")}
    if uri.startswith("pvc://") and uri[len("pvc://") :].split("/")[0] not in claims:
        out.append(f"kserve: storageUri {uri} names no PVC of deploy/k8s")
    needed = _seconds(drain_args([str(a) for a in pre_stop]).get("--timeout-s", "20")) + _seconds(
        flags.get("--exit-timeout-secs", "30")
    )
    if float(spec.get("terminationGracePeriodSeconds", 30)) < needed:
        out.append(f"kserve: terminationGracePeriodSeconds < drain + exit timeout ({needed:g})")
    out += launcher_flag_findings("kserve", args, ADMIN_KEY_REF)
    return out


def adapter_rules(path: Path = ADAPTER_RULES) -> list[dict[str, Any]]:
    doc = load_yaml(path)
    rules: list[dict[str, Any]] = (doc.get("rules") or {}).get("custom") or []
    return rules


def adapter_metric_aliases(path: Path = ADAPTER_RULES) -> set[str]:
    return {str((r.get("name") or {}).get("as", "")) for r in adapter_rules(path)}


# -- metrics named by the dashboard and the adapter -----------------------------------------------
def dashboard_queries(path: Path = DASHBOARD) -> list[str]:
    dash = json.loads(path.read_text())
    queries = [t["expr"] for p in dash.get("panels", []) for t in p.get("targets", [])]
    for var in (dash.get("templating") or {}).get("list", []):
        query = var.get("query")
        queries.append(query.get("query", "") if isinstance(query, dict) else str(query or ""))
    return queries


def referenced_metrics(queries: list[str]) -> set[str]:
    """Triton metric names (``nv_*``) appearing in PromQL queries."""
    return {m for q in queries for m in METRIC_NAME.findall(q)}


def promql_findings(queries: list[str]) -> list[str]:
    """Cheap PromQL sanity: balanced brackets and no empty query (there is no PromQL parser here)."""
    out: list[str] = []
    pairs = {")": "(", "]": "[", "}": "{"}
    for q in queries:
        stack: list[str] = []
        for ch in q:
            if ch in "([{":
                stack.append(ch)
            elif ch in pairs and (not stack or stack.pop() != pairs[ch]):
                stack.append("!")
                break
        if stack or not q.strip():
            out.append(f"promql: unbalanced or empty query: {q!r}")
    return out


# Triton accumulates these per *request* (every request of a batch gets the batch's time): a mean
# divides them by a request count, never by nv_inference_exec_count (batch-size times too high).
_PER_REQUEST_DURATION = re.compile(r"nv_inference_(?:request|queue|compute_\w+)_duration_us")


def duration_findings(queries: list[str]) -> list[str]:
    """Means of per-request durations divided by the execution count."""
    return [
        f"promql: a per-request duration divided by nv_inference_exec_count: {q!r}"
        for q in queries
        if _PER_REQUEST_DURATION.search(q) and "nv_inference_exec_count" in q.split("/", 1)[-1]
    ]


# -- images ---------------------------------------------------------------------------------------
def ngc_tag(dockerfile: Path = DOCKERFILE) -> str:
    """The NGC release (``24.10``) of the ``tritonserver`` image the Dockerfile builds FROM."""
    for line in dockerfile.read_text().splitlines():
        m = re.match(r"\s*FROM\s+nvcr\.io/nvidia/tritonserver:(\d{2}\.\d{2})-py3\b", line, re.I)
        if m:
            return m.group(1)
    raise DeployCheckError(
        f"{dockerfile} does not build FROM nvcr.io/nvidia/tritonserver:YY.MM-py3"
    )


def triton_version_for_ngc_tag(tag: str) -> str:
    try:
        return NGC_TRITON_RELEASES[tag]
    except KeyError as e:
        raise DeployCheckError(
            f"unknown NGC release {tag}; add it to NGC_TRITON_RELEASES from NVIDIA's release notes"
        ) from e


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    """``name==version`` lines of a requirements/constraints file (extras dropped, names normalised)."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*==\s*([^\s;]+)", line)
        if m:
            out[_normalise(m.group(1))] = m.group(3)
        elif line and not line.startswith("-"):
            out[_normalise(re.split(r"[\[<>=!~ ;]", line, maxsplit=1)[0])] = ""
    return out


def pin_findings(
    requirements: Path, constraints: Path = CONSTRAINTS, own: Mapping[str, str] | None = None
) -> list[str]:
    """Every package of ``requirements`` pinned exactly, to the same version as ``constraints``
    (or, for a name in ``own``, to that version)."""
    lock = {**pins(constraints), **(own or {})}
    out: list[str] = []
    for name, version in pins(requirements).items():
        if not version:
            out.append(f"{requirements.name}: {name} is not pinned with ==")
        elif name not in lock:
            out.append(f"{requirements.name}: {name} is not in {constraints.name}")
        elif lock[name].split("+")[0] != version:
            out.append(
                f"{requirements.name}: {name}=={version} but {constraints.name} has {lock[name]}"
            )
    return out


def dockerfile_installs(dockerfile: Path, requirements: Path) -> bool:
    """Whether the Dockerfile copies and ``pip install -r``s ``requirements``."""
    text = dockerfile.read_text()
    return (
        requirements.name in text
        and re.search(r"pip install[^\n]*(\\\n[^\n]*)*-r\s", text) is not None
    )


# -- what runs inside the Triton container --------------------------------------------------------
def _module_imports(tree: ast.AST, top_level_only: bool) -> Iterator[str]:
    nodes = tree.body if top_level_only and isinstance(tree, ast.Module) else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names)


@dataclass(frozen=True)
class ContainerCode:
    """Python files the container runs: the models' ``model.py`` and the shared package."""

    model_files: tuple[Path, ...]
    package_files: tuple[Path, ...]

    @classmethod
    def find(cls, repo: Path = MODEL_REPOSITORY, root: Path = PROJECT_ROOT) -> ContainerCode:
        return cls(
            model_files=tuple(sorted(repo.glob("*/[0-9]*/model.py"))),
            package_files=tuple(sorted((root / "tritonforge").glob("*.py"))),
        )


# `python3 -m tritonforge.runtime front` in the Triton image (docker-compose.yml, deploy/k8s).
FRONT_ENTRY = PROJECT_ROOT / "runtime" / "__main__.py"
FRONT_FIRST_PARTY = frozenset({"runtime", "tritonforge"})
# Import roots the Locust image provides beyond its pins: the project's code and the pins' deps.
LOADTEST_IMPORTS = frozenset({"client", "loadtest", "tritonforge", "grpc", "gevent"})


def _module_file(module: str, root: Path) -> list[Path]:
    """Files Python executes to import a first-party ``module`` (package ``__init__``s included)."""
    parts = module.split(".")
    files = [root.joinpath(*parts[:i], "__init__.py") for i in range(1, len(parts) + 1)]
    files.append(root.joinpath(*parts[:-1], parts[-1] + ".py"))
    return [f for f in files if f.exists()]


def loadtest_code(
    entry: Path = PROJECT_ROOT / "loadtest" / "locustfile.py",
    root: Path = PROJECT_ROOT,
    first_party: frozenset[str] = frozenset({"client", "loadtest", "tritonforge"}),
) -> ContainerCode:
    """What an image runs from ``entry`` (by default the Locust image's locustfile): the entry and
    the first-party modules it imports at top level, transitively."""
    seen: list[Path] = []
    todo = [entry]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.append(path)
        tree = ast.parse(path.read_text(), filename=str(path))
        for name in _module_imports(tree, top_level_only=True):
            if name.split(".")[0] in first_party:
                todo += _module_file(name, root)
    return ContainerCode(model_files=(), package_files=tuple(sorted(seen)))


def container_code_findings(
    code: ContainerCode,
    requirements: Path = TRITON_REQUIREMENTS,
    extra_allowed: frozenset[str] = frozenset({"triton_python_backend_utils", "tritonforge"}),
    python: tuple[int, int] = CONTAINER_PYTHON,
) -> list[str]:
    """Syntax of ``python`` and imports the image provides, for every file the image runs."""
    allowed = set(sys.stdlib_module_names) | set(extra_allowed)
    allowed |= {name.replace("-", "_") for name in pins(requirements)}
    out: list[str] = []
    for path, top_only in [(p, False) for p in code.model_files] + [
        (p, True) for p in code.package_files
    ]:
        src = path.read_text()
        try:
            tree = ast.parse(src, filename=str(path), feature_version=CONTAINER_PYTHON)
        except SyntaxError as e:
            out.append(
                f"{path}: not Python {CONTAINER_PYTHON[0]}.{CONTAINER_PYTHON[1]} syntax: {e}"
            )
            continue
        for name in _module_imports(tree, top_only):
            parts = name.split(".")
            if parts[0] not in allowed:
                out.append(f"{path}: imports {name}, which the image does not install")
            if python < (3, 11) and PY311_ONLY & set(parts):
                out.append(f"{path}: {name} needs Python 3.11; the container has 3.10")
    return out


# -- configs/gpu.pbtxt ----------------------------------------------------------------------------
def _tensors(config: Mapping[str, Any], key: str) -> list[tuple[str, str, tuple[int, ...]]]:
    return sorted(
        (str(t["name"]), str(t.get("data_type")), tuple(t.get("dims", [])))
        for t in config.get(key, [])
    )


_ONNX_TYPES = {1: "TYPE_FP32", 7: "TYPE_INT64", 6: "TYPE_INT32", 10: "TYPE_FP16", 9: "TYPE_BOOL"}


def onnx_signature(model: Path) -> dict[str, str]:
    """``{tensor name: TYPE_*}`` of an ONNX graph's inputs and outputs (weights not loaded)."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    return {
        v.name: _ONNX_TYPES.get(v.type.tensor_type.elem_type, str(v.type.tensor_type.elem_type))
        for v in [*graph.input, *graph.output]
    }


def gpu_config_findings(model_dir: Path) -> list[str]:
    """``configs/gpu.pbtxt`` of one model: parses, same interface as ``config.pbtxt``, KIND_GPU."""
    from tritonforge.errors import ModelConfigError
    from tritonforge.modelconfig import pbtxt_to_dict

    name = model_dir.name
    try:
        base = pbtxt_to_dict((model_dir / "config.pbtxt").read_text())
        gpu = pbtxt_to_dict((model_dir / "configs" / "gpu.pbtxt").read_text())
    except (OSError, ModelConfigError) as e:
        return [f"{name}: {e}"]
    out: list[str] = []
    if gpu.get("name", name) != name:
        out.append(f"{name}: gpu.pbtxt names the model {gpu.get('name')!r}")
    for key in ("backend", "platform", "max_batch_size", "default_model_filename"):
        if base.get(key) != gpu.get(key):
            out.append(
                f"{name}: {key} differs: config.pbtxt {base.get(key)!r}, gpu.pbtxt {gpu.get(key)!r}"
            )
    for key in ("input", "output"):
        if _tensors(base, key) != _tensors(gpu, key):
            out.append(f"{name}: {key}s differ between config.pbtxt and gpu.pbtxt")
    groups = gpu.get("instance_group") or []
    if not groups or any(g.get("kind") != "KIND_GPU" for g in groups):
        out.append(f"{name}: every instance_group of gpu.pbtxt must be KIND_GPU")
    accelerators = ((gpu.get("optimization") or {}).get("execution_accelerators") or {}).get(
        "gpu_execution_accelerator"
    ) or []
    for acc in accelerators:
        params = acc.get("parameters") or {}
        if acc.get("name") not in GPU_ACCELERATORS:
            out.append(f"{name}: unknown gpu_execution_accelerator {acc.get('name')!r}")
        if "precision_mode" in params and params["precision_mode"] not in TRT_PRECISIONS:
            out.append(
                f"{name}: precision_mode {params['precision_mode']!r} not in {TRT_PRECISIONS}"
            )
        cache = params.get("trt_engine_cache_path", "")
        if cache.startswith("/models"):
            out.append(
                f"{name}: trt_engine_cache_path {cache} is on the read-only model repository"
            )
    onnx_files = sorted(model_dir.glob("[0-9]*/model.onnx"))
    if onnx_files:
        signature = onnx_signature(onnx_files[0])
        for tname, dtype, _ in _tensors(gpu, "input") + _tensors(gpu, "output"):
            if tname not in signature:
                out.append(f"{name}: gpu.pbtxt tensor {tname} is not in the ONNX graph")
            elif signature[tname] != dtype:
                out.append(
                    f"{name}: {tname} is {dtype} in gpu.pbtxt, {signature[tname]} in the graph"
                )
    return out


def gpu_config_dirs(repo: Path = MODEL_REPOSITORY) -> list[Path]:
    return sorted(p.parent.parent for p in repo.glob("*/configs/gpu.pbtxt"))


# -- everything -----------------------------------------------------------------------------------
def all_findings(env: Mapping[str, str] | None = None) -> dict[str, list[str]]:
    """Every offline check, by name (the GPU config check only covers exported models)."""
    docs = kustomize_documents(K8S_DIR)
    operator_docs = kustomize_documents(K8S_DIR / "prometheus-operator")
    kserve_docs = kustomize_documents(KSERVE_DIR)
    queries = dashboard_queries() + [r["metricsQuery"] for r in adapter_rules()]
    return {
        "compose schema": validate_compose(COMPOSE_FILE, env),
        "compose contents": compose_findings(compose_document(COMPOSE_FILE, env)),
        "k8s schemas": validate_k8s(operator_docs),
        "k8s contents": k8s_findings(docs),
        "kserve schemas": validate_k8s(kserve_docs),
        "kserve contents": kserve_findings(kserve_docs, docs),
        "promql": promql_findings(queries) + duration_findings(queries),
        "triton image pins": pin_findings(TRITON_REQUIREMENTS, own=CONTAINER_PINS),
        "loadtest image pins": pin_findings(LOADTEST_REQUIREMENTS),
        "container code": container_code_findings(ContainerCode.find()),
        "loadtest image code": container_code_findings(
            loadtest_code(), LOADTEST_REQUIREMENTS, LOADTEST_IMPORTS, (3, 11)
        ),
        "front code": container_code_findings(
            loadtest_code(FRONT_ENTRY, first_party=FRONT_FIRST_PARTY),
            TRITON_REQUIREMENTS,
            FRONT_FIRST_PARTY | IMPORT_NAMES,
        ),
        "gpu configs": [f for d in gpu_config_dirs() for f in gpu_config_findings(d)],
        "manifest names": manifest_name_findings(MODEL_REPOSITORY, DEPLOY_DIR, [COMPOSE_FILE]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Offline checks of the deployment files.")
    parser.parse_args(argv)
    failed = 0
    for check, findings in all_findings(dict(os.environ)).items():
        print(f"{'ok  ' if not findings else 'FAIL'} {check}")
        for finding in findings:
            print(f"     {finding}")
        failed += bool(findings)
    exported = gpu_config_dirs()
    print(f"gpu configs checked: {[p.name for p in exported] or 'none (run `make export`)'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
