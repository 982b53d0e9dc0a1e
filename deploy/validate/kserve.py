"""``deploy/kserve``: the ServingRuntime serves the repository like the Deployment (same flags),
with KServe's mount and ports, a matching format/protocol and a storage URI naming the PVC."""

from __future__ import annotations

from typing import Any

from tritonforge.deploy.validate.documents import triton_flags
from tritonforge.deploy.validate.k8s import by_kind
from tritonforge.deploy.validate.launcher import (
    ADMIN_KEY_REF,
    DRAIN_MODULE,
    launcher_flag_findings,
    pre_stop_command,
    stop_budget_s,
)

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


def kserve_findings(docs: list[dict[str, Any]], base: list[dict[str, Any]]) -> list[str]:
    """The KServe runtime serves the model repository like the Deployment of ``base``."""
    runtimes, services = by_kind(docs, "ServingRuntime"), by_kind(docs, "InferenceService")
    if len(runtimes) != 1 or len(services) != 1:
        return ["kserve: expected one ServingRuntime and one InferenceService"]
    runtime, isvc = runtimes[0], services[0]
    out: list[str] = []
    (ctr,) = runtime["spec"]["containers"][:1] or [{}]
    args = [str(a) for a in ctr.get("args", [])]
    flags = triton_flags(args)
    dep = by_kind(base, "Deployment")[0]["spec"]["template"]["spec"]
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
    pre_stop = pre_stop_command(ctr)
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
    claims = {d["metadata"]["name"] for d in by_kind(base, "PersistentVolumeClaim")}
    if uri.startswith("pvc://") and uri[len("pvc://") :].split("/")[0] not in claims:
        out.append(f"kserve: storageUri {uri} names no PVC of deploy/k8s")
    needed = stop_budget_s(pre_stop, flags)
    if float(spec.get("terminationGracePeriodSeconds", 30)) < needed:
        out.append(f"kserve: terminationGracePeriodSeconds < drain + exit timeout ({needed:g})")
    out += launcher_flag_findings("kserve", args, ADMIN_KEY_REF)
    return out
