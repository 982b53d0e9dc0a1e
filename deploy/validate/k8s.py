"""``deploy/k8s``: kustomize resources against the vendored Kubernetes 1.31 strict schemas, and
probes, GPU limits, non-root, read-only root filesystem, the front sidecar and the HPA metric."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tritonforge.deploy.validate.documents import (
    DeployCheckError,
    load_schema,
    load_yaml,
    load_yaml_all,
    schema_errors,
    triton_flags,
)
from tritonforge.deploy.validate.launcher import (
    ADMIN_KEY_ENV,
    DRAIN_MODULE,
    front_args,
    front_findings,
    pre_stop_command,
    stop_budget_s,
)
from tritonforge.deploy.validate.monitoring import adapter_metric_aliases
from tritonforge.deploy.validate.paths import ADAPTER_RULES, K8S_DIR, K8S_SCHEMA_DIR

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
        out += schema_errors(body, load_schema(K8S_SCHEMA_DIR / K8S_SCHEMAS[key]), where)
    return out


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def k8s_findings(docs: list[dict[str, Any]], adapter_rules: Path = ADAPTER_RULES) -> list[str]:
    """What this project needs from the manifests beyond their schemas."""
    out: list[str] = []
    deployments = by_kind(docs, "Deployment")
    if len(deployments) != 1:
        return [f"k8s: expected one Deployment, found {len(deployments)}"]
    dep = deployments[0]
    pod = dep["spec"]["template"]["spec"]
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
        return ["k8s: the Deployment has no `front` container (runtime/front/app.py before Triton)"]
    out += k8s_front_findings(pod, triton, front)
    front_flags = triton_flags(
        front_args([*front.get("command", []), *front.get("args", [])]) or []
    )
    out += _probe_findings(pod, triton, flags, front_flags)
    out += _container_findings(pod, triton)
    out += _repository_findings(docs, pod, triton)
    return out + _service_findings(docs, dep, adapter_rules)


def _probe_findings(
    pod: Mapping[str, Any],
    triton: Mapping[str, Any],
    flags: Mapping[str, str],
    front_flags: Mapping[str, str],
) -> list[str]:
    """Liveness (a canary inference, server#8604), the preStop drain and its grace period, and
    the gRPC startup probe through the front."""
    out: list[str] = []
    liveness = triton.get("livenessProbe") or {}
    canary = " ".join(str(a) for a in (liveness.get("exec") or {}).get("command", []))
    if (liveness.get("httpGet") or {}).get("path") != "/v2/health/live" and not (
        "/infer" in canary or "tritonforge.canary" in canary
    ):
        out.append("k8s: livenessProbe must GET /v2/health/live or run a canary inference")
    pre_stop = pre_stop_command(triton)
    if DRAIN_MODULE not in pre_stop or "wait" not in pre_stop:
        out.append(
            f"k8s: triton needs a preStop hook running `python3 -m {DRAIN_MODULE} wait` "
            "(drain before SIGTERM, server#6287)"
        )
    else:
        needed = stop_budget_s(pre_stop, flags)
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
    return out


def _container_findings(pod: Mapping[str, Any], triton: Mapping[str, Any]) -> list[str]:
    """Triton's GPU and memory limits, non-root, read-only root filesystem, and the emptyDirs
    it writes to (/tmp, and /dev/shm in memory)."""
    out: list[str] = []
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
    return out


def _repository_findings(
    docs: list[dict[str, Any]], pod: Mapping[str, Any], triton: Mapping[str, Any]
) -> list[str]:
    """/models: a read-only mount of a PersistentVolumeClaim that the manifests declare."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    repo = {m["mountPath"]: m for m in triton.get("volumeMounts", [])}.get("/models")
    repo_vol = volumes.get(repo["name"]) if repo else None
    if (
        not repo
        or not repo.get("readOnly")
        or not repo_vol
        or "persistentVolumeClaim" not in repo_vol
    ):
        return ["k8s: /models must be a read-only mount of a PersistentVolumeClaim"]
    if repo_vol["persistentVolumeClaim"]["claimName"] not in {
        d["metadata"]["name"] for d in by_kind(docs, "PersistentVolumeClaim")
    }:
        return ["k8s: the model repository's PVC is not among the manifests"]
    return []


def _service_findings(
    docs: list[dict[str, Any]], dep: Mapping[str, Any], adapter_rules: Path
) -> list[str]:
    """Every Service selects the Triton pods; one HPA targets the Deployment on served metrics."""
    out: list[str] = []
    labels = dep["spec"]["template"]["metadata"].get("labels", {})
    for svc in by_kind(docs, "Service"):
        selector = svc["spec"].get("selector", {})
        if not selector or any(labels.get(k) != v for k, v in selector.items()):
            out.append(f"k8s: Service {svc['metadata']['name']} does not select the Triton pods")
    hpas = by_kind(docs, "HorizontalPodAutoscaler")
    if len(hpas) != 1:
        return [*out, f"k8s: expected one HorizontalPodAutoscaler, found {len(hpas)}"]
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

    f_read_only = {m["mountPath"]: bool(m.get("readOnly")) for m in front.get("volumeMounts", [])}

    def same_volume(path: str) -> bool:  # the same volume, read-only in the front
        name = t_mounts.get(path)
        return name is not None and name == f_mounts.get(path) and f_read_only[path]

    out = front_findings(
        "k8s", [str(a) for a in triton.get("args", [])], command, shared, from_secret, same_volume
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
    pre_stop = pre_stop_command(front)
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
