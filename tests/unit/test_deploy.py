"""Offline checks of the deployment: compose file and Kubernetes manifests against their vendored
schemas, GPU configs against config.pbtxt and the ONNX graph, image pins against constraints.txt,
the container's Python code, monitoring queries, and the GPU check's CPU-only path."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tritonforge.deploy import gpu_check
from tritonforge.deploy import validate as dv

COMPOSE_ENV_OVERRIDES = {
    "TRITON_MODEL_CONFIG": "config",
    "TRITON_GPU_COUNT": "2",
    "TRITON_HTTP_PORT": "18000",
    "TRITON_IMAGE": "registry.example/tritonforge:1",
}


# -- docker compose --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc: dict[str, Any] = dv.compose_document()
    return doc


@pytest.fixture(scope="module")
def compose_schema() -> dict[str, Any]:
    return dv.load_schema(dv.SCHEMA_DIR / "compose-spec.json")


@pytest.mark.parametrize("env", [{}, COMPOSE_ENV_OVERRIDES], ids=["defaults", "overrides"])
def test_compose_file_matches_the_compose_specification(env: dict[str, str]) -> None:
    assert dv.validate_compose(dv.COMPOSE_FILE, env) == []


def test_compose_schema_rejects_what_compose_would(
    compose: dict[str, Any], compose_schema: dict[str, Any]
) -> None:
    broken = copy.deepcopy(compose)
    broken["services"]["triton"]["shm_sise"] = "2gb"
    broken["services"]["triton"]["ports"] = {"http": 8000}
    errors = dv.schema_errors(broken, compose_schema, "compose")
    assert any("shm_sise" in e for e in errors)
    assert any("services/triton/ports" in e for e in errors)


def test_compose_has_what_the_deployment_needs(compose: dict[str, Any]) -> None:
    assert dv.compose_findings(compose) == []
    triton = compose["services"]["triton"]
    assert dv.triton_flags(triton["command"])["--model-config-name"] == "gpu"


def test_compose_model_config_name_is_selectable_by_env() -> None:
    doc = dv.compose_document(env={"TRITON_MODEL_CONFIG": "config"})
    assert dv.triton_flags(doc["services"]["triton"]["command"])["--model-config-name"] == "config"


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda t: t["deploy"].pop("resources"), "GPU reservation"),
        (lambda t: t["volumes"][0].update(read_only=False), "read-only"),
        (lambda t: t.update(user="0:0"), "non-root"),
        (lambda t: t.update(shm_size="64m"), "shm_size"),
        (lambda t: t["healthcheck"].update(test=["CMD", "true"]), "/v2/health/ready"),
        (lambda t: t["command"].append("--model-control-mode=poll"), "model-control-mode"),
        (lambda t: t.update(command=dv.triton_command(t["command"])), "tritonforge.drain"),
        (lambda t: t.update(stop_grace_period="10s"), "stop_grace_period"),
        (lambda t: t["ports"].__setitem__(0, "8000:8000"), "bind address"),
        (lambda t: t["ports"].__setitem__(0, "0.0.0.0:8000:8000"), "bind address"),
        (
            lambda t: t["command"].append(
                "--http-restricted-api=model-config:x-tritonforge-admin=$(TRITONFORGE_ADMIN_KEY)"
            ),
            "takes no --http-restricted-api",
        ),
        (lambda t: t["ports"].append("127.0.0.1:8000:8000"), "only its --metrics-port"),
        (
            lambda t: t.update(
                command=[a.replace("unix:", "") if "-address=" in a else a for a in t["command"]]
            ),
            "--http-address=unix:/run/tritonforge/http.sock",
        ),
        (
            lambda t: t.update(command=[a for a in t["command"] if a != "--grpc-port=1"]),
            "--grpc-port=1",
        ),
        (lambda t: t["volumes"].pop(1), "mounted by both"),
        (lambda t: t.pop("depends_on"), "depend on the front"),
        (
            lambda t: t.update(command=[a for a in t["command"] if "mode=opentelemetry" not in a]),
            "mode=opentelemetry",
        ),
    ],
)
def test_compose_findings_catch_regressions(
    compose: dict[str, Any], mutate: Any, expected: str
) -> None:
    broken = copy.deepcopy(compose)
    mutate(broken["services"]["triton"])
    assert any(expected in f for f in dv.compose_findings(broken))


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d["services"].pop("front"), "no `front` service"),
        (lambda d: d["services"]["front"]["ports"].pop(1), "--grpc-port"),
        (lambda d: d["services"]["front"]["ports"].__setitem__(0, "8000:8000"), "bind address"),
        (lambda d: d["services"]["front"].pop("environment"), "TRITONFORGE_ADMIN_KEY"),
        (
            lambda d: d["services"]["front"]["command"].append("--admin-key-env=OTHER"),
            "TRITONFORGE_ADMIN_KEY in its environment",
        ),
        (
            lambda d: d["services"]["front"]["command"].__setitem__(4, "--socket-dir=/tmp"),
            "mounted by both",
        ),
        (
            lambda d: d["services"]["front"]["command"].__setitem__(2, "tritonforge"),
            "python3 -m tritonforge.runtime front",
        ),
        (lambda d: d["services"]["front"].update(user="0:0"), "triton's user"),
        (lambda d: d["services"]["front"].update(stop_grace_period="1s"), "stop_grace_period"),
        (lambda d: d["services"]["front"].pop("healthcheck"), "front healthcheck"),
        (
            lambda d: d["volumes"]["triton-sockets"]["driver_opts"].update(o="mode=0777"),
            "mode=0700",
        ),
        # #19: the sidecar front had no --model-repository (/v1 off in compose) and no tracing
        (
            lambda d: d["services"]["front"]["command"].remove("--model-repository=/models"),
            "the front needs --model-repository=/models",
        ),
        (
            lambda d: d["services"]["front"]["volumes"].pop(1),
            "the front must mount /models from tritonserver's model repository volume",
        ),
        (
            lambda d: d["services"]["front"]["volumes"][1].pop("read_only"),
            "(read-only)",
        ),
        (
            lambda d: d["services"]["front"]["command"].remove("--traced=true"),
            "the front needs --traced=true",
        ),
    ],
)
def test_compose_front_findings_catch_regressions(
    compose: dict[str, Any], mutate: Any, expected: str
) -> None:
    broken = copy.deepcopy(compose)
    mutate(broken)
    assert any(expected in f for f in dv.compose_findings(broken))


def test_compose_refuses_to_start_without_an_admin_key() -> None:
    raw = dv.load_yaml(dv.COMPOSE_FILE)
    with pytest.raises(dv.DeployCheckError, match="TRITONFORGE_ADMIN_KEY"):
        dv.interpolate(raw, {})
    doc = dv.interpolate(raw, {"TRITONFORGE_ADMIN_KEY": "s3cret"})
    assert doc["services"]["front"]["environment"]["TRITONFORGE_ADMIN_KEY"] == "s3cret"
    commands = [a for svc in doc["services"].values() for a in svc.get("command") or []]
    assert not any("s3cret" in str(a) for a in commands)  # never on a command line


def test_interpolation_follows_compose_rules() -> None:
    env = {"SET": "x", "EMPTY": ""}
    assert (
        dv.interpolate("${SET:-d}/${UNSET:-d}/${EMPTY:-d}/${EMPTY-d}/$${SET}", env)
        == "x/d/d//${SET}"
    )
    assert dv.interpolate({"a": ["${UNSET}"]}, env) == {"a": [""]}
    with pytest.raises(dv.DeployCheckError, match="NEEDED"):
        dv.interpolate("${NEEDED:?set it}", env)


def test_monitoring_and_loadtest_point_at_the_triton_service(compose: dict[str, Any]) -> None:
    prometheus = dv.load_yaml(dv.DEPLOY_DIR / "monitoring" / "prometheus.yml")
    targets = [
        t
        for job in prometheus["scrape_configs"]
        for s in job["static_configs"]
        for t in s["targets"]
    ]
    metrics_port = dv.triton_flags(compose["services"]["triton"]["command"])["--metrics-port"]
    assert targets == [f"triton:{metrics_port}"]
    grafana = compose["services"]["grafana"]
    provider = dv.load_yaml(
        dv.DEPLOY_DIR / "monitoring/grafana/provisioning/dashboards/dashboards.yml"
    )["providers"][0]
    assert any(v.endswith(":" + provider["options"]["path"] + ":ro") for v in grafana["volumes"])
    front = dv.triton_flags(dv.front_args(compose["services"]["front"]["command"]) or [])
    http_port, grpc_port = front["--http-port"], front["--grpc-port"]
    master = compose["services"]["locust-master"]
    assert f"--host=http://front:{http_port}" in master["command"]
    locustfile = dv.default_locustfile().relative_to(dv.PROJECT_ROOT).as_posix()
    assert f"/app/{locustfile}" in master["command"]
    assert f"/app/{locustfile}" in compose["services"]["locust-worker"]["command"]
    assert f"--grpc-url=front:{grpc_port}" in master["command"]
    assert master["environment"]["TRITONFORGE_URL"] == f"front:{http_port}"


# -- kubernetes ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def k8s_docs() -> list[dict[str, Any]]:
    return dv.kustomize_documents(dv.K8S_DIR)


def test_kustomize_base_lists_the_expected_resources(k8s_docs: list[dict[str, Any]]) -> None:
    kinds = sorted(d["kind"] for d in k8s_docs)
    assert kinds == ["Deployment", "HorizontalPodAutoscaler", "PersistentVolumeClaim", "Service"]
    with_operator = dv.kustomize_documents(dv.K8S_DIR / "prometheus-operator")
    assert sorted(d["kind"] for d in with_operator) == sorted([*kinds, "PodMonitor"])


def test_k8s_manifests_match_their_schemas() -> None:
    assert dv.validate_k8s(dv.kustomize_documents(dv.K8S_DIR / "prometheus-operator")) == []


def test_k8s_schemas_reject_unknown_fields_and_wrong_types(k8s_docs: list[dict[str, Any]]) -> None:
    broken = copy.deepcopy(k8s_docs)
    dep = next(d for d in broken if d["kind"] == "Deployment")
    dep["spec"]["template"]["spec"]["containers"][1]["readinessProbe"]["httpGett"] = {}
    dep["spec"]["replicas"] = "two"
    hpa = next(d for d in broken if d["kind"] == "HorizontalPodAutoscaler")
    hpa["spec"]["maxReplica"] = 8
    errors = dv.validate_k8s(broken)
    assert any("httpGett" in e for e in errors)
    assert any("spec/replicas" in e for e in errors)
    assert any("HorizontalPodAutoscaler" in e and "maxReplica" in e for e in errors)
    assert dv.validate_k8s([{"apiVersion": "v1", "kind": "Secret"}])  # no schema -> finding


def test_k8s_deployment_has_what_production_needs(k8s_docs: list[dict[str, Any]]) -> None:
    assert dv.k8s_findings(k8s_docs) == []


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda pod, ctr: ctr["securityContext"].pop("readOnlyRootFilesystem"),
            "readOnlyRootFilesystem",
        ),
        (lambda pod, ctr: pod["securityContext"].pop("runAsNonRoot"), "runAsNonRoot"),
        (lambda pod, ctr: ctr["resources"]["limits"].pop("nvidia.com/gpu"), "nvidia.com/gpu"),
        (
            lambda pod, ctr: pod["containers"][1]["readinessProbe"]["httpGet"].update(path="/"),
            "readinessProbe",
        ),
        (lambda pod, ctr: ctr["livenessProbe"]["exec"].update(command=["true"]), "livenessProbe"),
        (lambda pod, ctr: ctr.pop("lifecycle"), "preStop"),
        (
            lambda pod, ctr: ctr["lifecycle"]["preStop"]["exec"].update(command=["sleep", "10"]),
            "tritonforge.drain wait",
        ),
        (lambda pod, ctr: pod.update(terminationGracePeriodSeconds=30), "GracePeriod"),
        (lambda pod, ctr: pod["containers"][1]["env"][1].pop("valueFrom"), "Secret"),
        (lambda pod, ctr: ctr["startupProbe"]["grpc"].update(port=9999), "gRPC startup probe"),
        (
            lambda pod, ctr: ctr["args"].append(
                "--grpc-restricted-protocol=logging:x-tritonforge-admin=$(TRITONFORGE_ADMIN_KEY)"
            ),
            "takes no --grpc-restricted-protocol",
        ),
        (lambda pod, ctr: pod["containers"].pop(1), "no `front` container"),
        (
            lambda pod, ctr: ctr["args"].remove("--http-address=unix:/run/tritonforge/http.sock"),
            "--http-address=unix:",
        ),
        (lambda pod, ctr: ctr["volumeMounts"].pop(3), "mounted by both"),
        (
            lambda pod, ctr: ctr["ports"].append({"name": "http", "containerPort": 8000}),
            "only the front",
        ),
        (lambda pod, ctr: pod["containers"][1]["ports"].pop(1), "--grpc-port"),
        (lambda pod, ctr: pod["containers"][1].pop("lifecycle"), "forward while triton drains"),
        (
            lambda pod, ctr: pod["containers"][1]["args"].append("--admin-key-env=OTHER"),
            "in its environment",
        ),
        (lambda pod, ctr: pod["volumes"][2]["emptyDir"].pop("medium"), "/dev/shm"),
        (lambda pod, ctr: ctr["volumeMounts"][0].pop("readOnly"), "/models"),
        (lambda pod, ctr: ctr["args"].append("--model-config-name=config"), "--model-config-name"),
        (
            lambda pod, ctr: pod["containers"][1]["args"].remove("--model-repository=/models"),
            "the front needs --model-repository=/models",
        ),
        (
            lambda pod, ctr: pod["containers"][1]["volumeMounts"].pop(2),
            "the front must mount /models",
        ),
        (
            lambda pod, ctr: pod["containers"][1]["args"].remove("--traced=true"),
            "the front needs --traced=true",
        ),
    ],
)
def test_k8s_findings_catch_regressions(
    k8s_docs: list[dict[str, Any]], mutate: Any, expected: str
) -> None:
    broken = copy.deepcopy(k8s_docs)
    pod = next(d for d in broken if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    mutate(pod, pod["containers"][0])
    assert any(expected in f for f in dv.k8s_findings(broken))


@pytest.fixture(scope="module")
def kserve_docs() -> list[dict[str, Any]]:
    return dv.kustomize_documents(dv.KSERVE_DIR)


def test_kserve_manifests_match_their_schemas_and_the_deployment(
    kserve_docs: list[dict[str, Any]], k8s_docs: list[dict[str, Any]]
) -> None:
    assert sorted(d["kind"] for d in kserve_docs) == ["InferenceService", "ServingRuntime"]
    assert dv.validate_k8s(kserve_docs) == []
    assert dv.kserve_findings(kserve_docs, k8s_docs) == []


def test_kserve_schemas_reject_unknown_fields(kserve_docs: list[dict[str, Any]]) -> None:
    broken = copy.deepcopy(kserve_docs)
    isvc = next(d for d in broken if d["kind"] == "InferenceService")
    isvc["spec"]["predictor"]["model"]["storageURI"] = "s3://typo"
    runtime = next(d for d in broken if d["kind"] == "ServingRuntime")
    runtime["spec"]["containers"][0]["imagePullPolice"] = "Always"
    runtime["spec"]["supportedModelFormats"][0]["autoselect"] = True
    errors = dv.validate_k8s(broken)
    assert any("storageURI" in e for e in errors)
    assert any("imagePullPolice" in e for e in errors)
    assert any("autoselect" in e for e in errors)
    isvc["spec"]["predictor"]["model"].pop("storageURI")
    isvc["spec"]["predictor"]["model"]["storageUri"] = "ftp://host/repo"
    assert any("storageUri" in e for e in dv.validate_k8s([isvc]))


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda rt, isvc: rt["containers"][0]["args"].append("--log-verbose=1"), "flags differ"),
        (
            lambda rt, isvc: rt["containers"][0]["args"].__setitem__(0, "--model-repository=/m"),
            "/mnt/models",
        ),
        (lambda rt, isvc: rt["containers"][0]["ports"][0].update(containerPort=1), "h2c"),
        (lambda rt, isvc: rt["containers"][0].pop("lifecycle"), "preStop"),
        (lambda rt, isvc: isvc["predictor"]["model"].update(runtime="other"), "ServingRuntime"),
        (
            lambda rt, isvc: isvc["predictor"]["model"]["modelFormat"].update(name="onnx"),
            "modelFormat",
        ),
        (
            lambda rt, isvc: isvc["predictor"]["model"].update(protocolVersion="v1"),
            "protocolVersion",
        ),
        (lambda rt, isvc: isvc["predictor"]["model"].update(storageUri="pvc://nope/"), "PVC"),
        (
            lambda rt, isvc: isvc["predictor"].update(terminationGracePeriodSeconds=10),
            "GracePeriod",
        ),
    ],
)
def test_kserve_findings_catch_regressions(
    kserve_docs: list[dict[str, Any]], k8s_docs: list[dict[str, Any]], mutate: Any, expected: str
) -> None:
    broken = copy.deepcopy(kserve_docs)
    runtime = next(d for d in broken if d["kind"] == "ServingRuntime")["spec"]
    isvc = next(d for d in broken if d["kind"] == "InferenceService")["spec"]
    mutate(runtime, isvc)
    assert any(expected in f for f in dv.kserve_findings(broken, k8s_docs))


def test_kserve_object_storage_uris_are_accepted(kserve_docs: list[dict[str, Any]]) -> None:
    isvc = copy.deepcopy(next(d for d in kserve_docs if d["kind"] == "InferenceService"))
    for uri in ("s3://bucket/tritonforge/model_repository", "gs://bucket/model_repository"):
        isvc["spec"]["predictor"]["model"]["storageUri"] = uri
        assert dv.validate_k8s([isvc]) == []


def test_hpa_metric_is_served_by_the_adapter_rule(
    k8s_docs: list[dict[str, Any]], tmp_path: Path
) -> None:
    hpa = next(d for d in k8s_docs if d["kind"] == "HorizontalPodAutoscaler")
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] in dv.adapter_metric_aliases()
    rule = dv.adapter_rules()[0]
    assert "<<.LabelMatchers>>" in rule["metricsQuery"] and "<<.GroupBy>>" in rule["metricsQuery"]
    assert {"namespace", "pod"} == set(rule["resources"]["overrides"])
    other = tmp_path / "rules.yaml"
    other.write_text("rules:\n  custom:\n    - name: {as: something_else}\n")
    assert any("not served" in f for f in dv.k8s_findings(k8s_docs, adapter_rules=other))


def test_compose_and_k8s_run_triton_with_the_same_flags(
    compose: dict[str, Any], k8s_docs: list[dict[str, Any]]
) -> None:
    dep = next(d for d in k8s_docs if d["kind"] == "Deployment")
    ctr = dep["spec"]["template"]["spec"]["containers"][0]
    compose_cmd = dv.triton_command(compose["services"]["triton"]["command"])
    assert [compose_cmd[0]] == ctr["command"]
    # repeated flags (--trace-config) in the same order
    assert compose_cmd[1:] == ctr["args"]
    assert dv.triton_flags(compose_cmd) == dv.triton_flags(ctr["args"])
    ports = {p["name"]: str(p["containerPort"]) for p in ctr["ports"]}
    flags = dv.triton_flags(ctr["args"])
    assert ports == {"metrics": flags["--metrics-port"]}  # inference through the front
    front = dep["spec"]["template"]["spec"]["containers"][1]
    assert front["command"] + front["args"] == compose["services"]["front"]["command"]
    annotations = dep["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == flags["--metrics-port"]


# -- images ----------------------------------------------------------------------------------------
def test_image_tag_is_the_embedded_servers_release() -> None:
    # The live comparison with the embedded server's /v2 metadata is in
    # tests/integration/test_deploy_server.py; this pins the mapping the image relies on.
    assert dv.ngc_tag() == "24.10"
    assert dv.triton_version_for_ngc_tag(dv.ngc_tag()) == "2.51.0"
    with pytest.raises(dv.DeployCheckError, match="NGC_TRITON_RELEASES"):
        dv.triton_version_for_ngc_tag("19.01")


def test_the_image_leaves_no_dangling_package_links(tmp_path: Path) -> None:
    assert dv.image_link_findings() == []
    # the Dockerfile before the fix: runtime/ copied, client/ & co. left as dangling links
    old = tmp_path / "Dockerfile"
    old.write_text(
        "COPY tritonforge /opt/tritonforge/tritonforge\nCOPY runtime /opt/tritonforge/runtime\n"
    )
    findings = dv.image_link_findings(old)
    assert any("tritonforge/client links to client/" in f for f in findings), findings
    assert not any("tritonforge/runtime" in f for f in findings), findings


@pytest.mark.parametrize(
    ("dockerfile", "requirements", "own"),
    [
        (dv.DOCKERFILE, dv.TRITON_REQUIREMENTS, dv.CONTAINER_PINS),
        (dv.DEPLOY_DIR / "Dockerfile.loadtest", dv.LOADTEST_REQUIREMENTS, {}),
    ],
)
def test_image_python_packages_equal_the_lock_file(
    dockerfile: Path, requirements: Path, own: dict[str, str]
) -> None:
    assert dv.dockerfile_installs(dockerfile, requirements)
    assert dv.pins(requirements), f"{requirements} pins nothing"
    assert dv.pin_findings(requirements, own=own) == []
    # an own pin only for what the lock cannot give the container's Python
    lock = dv.pins(dv.CONSTRAINTS)
    assert all(lock.get(name) != version for name, version in own.items())


def test_triton_image_has_what_the_front_imports() -> None:
    code = dv.loadtest_code(dv.FRONT_ENTRY, first_party=dv.FRONT_FIRST_PARTY)
    names = {p.relative_to(dv.PROJECT_ROOT).as_posix() for p in code.package_files}
    runtime = {"front/app.py", "cli/main.py", "errors.py"}
    assert {f"tritonforge/runtime/{name}" for name in runtime} <= names
    allowed = dv.FRONT_FIRST_PARTY | dv.IMPORT_NAMES
    assert dv.container_code_findings(code, dv.TRITON_REQUIREMENTS, allowed) == []
    missing = copy.deepcopy(allowed) - {"grpc"}
    findings = dv.container_code_findings(code, dv.TRITON_REQUIREMENTS, frozenset(missing))
    assert any("imports grpc" in f for f in findings)


def test_pin_check_catches_drift(tmp_path: Path) -> None:
    lock = tmp_path / "constraints.txt"
    lock.write_text("numpy==1.26.4\ntorch==2.13.0+cpu\n")
    req = tmp_path / "req.txt"
    req.write_text("numpy==1.26.3\ntorch==2.13.0\nTokenizers>=0.2\nmissing-pkg==1.0\n")
    findings = dv.pin_findings(req, lock)
    assert len(findings) == 3
    assert any("numpy==1.26.3" in f for f in findings)
    assert any("tokenizers is not pinned" in f for f in findings)
    assert any("missing-pkg is not in" in f for f in findings)


def test_container_code_runs_on_the_images_python_with_its_packages() -> None:
    code = dv.ContainerCode.find()
    assert code.package_files, "tritonforge/ not found"
    assert dv.container_code_findings(code) == []


def test_loadtest_image_provides_what_the_locustfile_imports() -> None:
    code = dv.loadtest_code()
    assert dv.default_locustfile() in code.package_files
    findings = dv.container_code_findings(
        code, dv.LOADTEST_REQUIREMENTS, dv.LOADTEST_IMPORTS, (3, 11)
    )
    assert findings == []


def test_container_code_check_catches_311_code_and_missing_packages(tmp_path: Path) -> None:
    model = tmp_path / "m" / "1" / "model.py"
    model.parent.mkdir(parents=True)
    model.write_text(
        "import triton_python_backend_utils as pb_utils\nimport torch\nimport tomllib\n"
        "def f():\n    from enum import StrEnum\n"
    )
    pkg = tmp_path / "p.py"
    pkg.write_text("try:\n    pass\nexcept* ValueError:\n    pass\n")
    findings = dv.container_code_findings(dv.ContainerCode((model,), (pkg,)))
    assert any("imports torch" in f for f in findings)  # the image has onnxruntime, not torch
    assert any("tomllib" in f for f in findings)
    assert any("StrEnum" in f for f in findings)
    assert any("syntax" in f for f in findings)


# -- configs/gpu.pbtxt -----------------------------------------------------------------------------
CPU_CONFIG = """
name: "enc"
backend: "onnxruntime"
max_batch_size: 64
input [{ name: "input_ids" data_type: TYPE_INT64 dims: [-1] }]
output [{ name: "sentence_embedding" data_type: TYPE_FP32 dims: [4] }]
instance_group [{ kind: KIND_CPU count: 1 }]
"""
# The same model on a GPU: the instance group, batching and the TensorRT accelerator differ.
GPU_CONFIG = CPU_CONFIG.replace(
    "instance_group [{ kind: KIND_CPU count: 1 }]\n",
    """instance_group [{ kind: KIND_GPU count: 1 gpus: [0] }]
dynamic_batching { preferred_batch_size: [16, 32, 64] }
optimization { execution_accelerators { gpu_execution_accelerator: [
  { name: "tensorrt" parameters { key: "precision_mode" value: "FP16" }
                     parameters { key: "trt_engine_cache_path" value: "/tmp/trt" } }
] } }
""",
)


def _tiny_encoder(path: Path, output_dim: int = 4) -> Path:
    """input_ids, attention_mask, token_type_ids (int64) -> sentence_embedding (B, output_dim)."""
    names = ["input_ids", "attention_mask", "token_type_ids"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["B", "S"]) for n in names]
    out = helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["B", output_dim])
    weight = helper.make_tensor(
        "w", TensorProto.FLOAT, [1, output_dim], np.linspace(0.5, 2.0, output_dim).tolist()
    )
    nodes = [
        helper.make_node("Mul", ["input_ids", "attention_mask"], ["masked"]),
        helper.make_node("Add", ["masked", "token_type_ids"], ["summed"]),
        helper.make_node("Cast", ["summed"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["f", "axes"], ["f3"]),
        helper.make_node("MatMul", ["f3", "w"], ["h"]),
        # mean over the sequence axis -> (B, output_dim)
        helper.make_node("ReduceMean", ["h", "seq_axis"], ["sentence_embedding"], keepdims=0),
    ]
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [-1])
    graph = helper.make_graph(
        nodes,
        "tiny",
        inputs,
        [out],
        initializer=[weight, axes, helper.make_tensor("seq_axis", TensorProto.INT64, [1], [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def _model_dir(tmp_path: Path, gpu_config: str) -> Path:
    model_dir = tmp_path / "enc"
    (model_dir / "configs").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(CPU_CONFIG)
    (model_dir / "configs" / "gpu.pbtxt").write_text(gpu_config)
    _tiny_encoder(model_dir / "1" / "model.onnx")
    return model_dir


def test_gpu_config_check_accepts_a_consistent_config(tmp_path: Path) -> None:
    assert dv.gpu_config_findings(_model_dir(tmp_path, GPU_CONFIG)) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("KIND_GPU count: 1 gpus: [0]", "KIND_CPU count: 1"), "KIND_GPU"),
        (("max_batch_size: 64", "max_batch_size: 8"), "max_batch_size differs"),
        (("dims: [4]", "dims: [8]"), "outputs differ"),
        (('"tensorrt"', '"tensorrrt"'), "unknown gpu_execution_accelerator"),
        (('"FP16"', '"FP8"'), "precision_mode"),
        (('"/tmp/trt"', '"/models/enc/trt"'), "read-only"),
        (("dims: [-1] }]", "dims: [-1 }]"), "does not parse"),
    ],
)
def test_gpu_config_check_catches_mismatches(
    tmp_path: Path, change: tuple[str, str], expected: str
) -> None:
    findings = dv.gpu_config_findings(_model_dir(tmp_path, GPU_CONFIG.replace(*change)))
    assert any(expected in f for f in findings), findings


def test_gpu_config_check_compares_with_the_onnx_graph(tmp_path: Path) -> None:
    renamed = GPU_CONFIG.replace('"input_ids"', '"ids"')
    model_dir = _model_dir(tmp_path, renamed)
    (model_dir / "config.pbtxt").write_text(CPU_CONFIG.replace('"input_ids"', '"ids"'))
    assert any("not in the ONNX graph" in f for f in dv.gpu_config_findings(model_dir))


EXPORTED = dv.gpu_config_dirs()


@pytest.mark.skipif(
    not EXPORTED, reason="no model_repository/*/configs/gpu.pbtxt yet: run `make export` first"
)
@pytest.mark.parametrize("model_dir", EXPORTED, ids=[p.name for p in EXPORTED])
def test_exported_gpu_configs_match_config_and_graph(model_dir: Path) -> None:
    assert dv.gpu_config_findings(model_dir) == []


# -- monitoring queries ----------------------------------------------------------------------------
# The metrics the dashboard must read, by what its panels show (space-separated names).
DASHBOARD_METRICS = {
    "rate, failures, p95 queue and compute": "nv_inference_request_success "
    "nv_inference_request_failure nv_inference_queue_summary_us "
    "nv_inference_compute_infer_summary_us",
    "pending, cache, versions and GPUs": "nv_inference_pending_request_count "
    "nv_cache_num_hits_per_model nv_cache_num_misses_per_model nv_gpu_utilization "
    "nv_gpu_memory_used_bytes nv_gpu_memory_total_bytes",
}


@pytest.mark.parametrize("shows", DASHBOARD_METRICS)
def test_dashboard_reads_the_metrics_of_each_panel_group(shows: str) -> None:
    assert set(DASHBOARD_METRICS[shows].split()) <= dv.referenced_metrics(dv.dashboard_queries())


def test_dashboard_shows_rate_p95_queue_and_compute_and_failures() -> None:
    queries = dv.dashboard_queries()
    assert dv.promql_findings(queries) == []
    assert any('quantile="0.95"' in q and "queue" in q for q in queries)
    dash = json.loads(dv.DASHBOARD.read_text())
    assert all(t["datasource"]["uid"] == "prometheus" for p in dash["panels"] for t in p["targets"])
    datasource = dv.load_yaml(
        dv.DEPLOY_DIR / "monitoring/grafana/provisioning/datasources/prometheus.yml"
    )
    assert datasource["datasources"][0]["uid"] == "prometheus"


def test_dashboard_means_divide_per_request_durations_by_request_counts() -> None:
    queries = dv.dashboard_queries()
    assert dv.duration_findings(queries) == []
    wrong = (
        "sum(rate(nv_inference_compute_infer_duration_us[1m])) / "
        "sum(rate(nv_inference_exec_count[1m]))"
    )
    assert dv.duration_findings([wrong]) != []
    # batching: inferences per execution legitimately divides by the execution count
    assert (
        dv.duration_findings(["rate(nv_inference_count[1m]) / rate(nv_inference_exec_count[1m])"])
        == []
    )


def test_dashboard_shows_pending_cache_versions_and_gpus() -> None:
    queries = dv.dashboard_queries()
    assert any("by (model, version)" in q and "nv_inference_request_success" in q for q in queries)
    dash = json.loads(dv.DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def test_promql_check_catches_unbalanced_queries() -> None:
    assert dv.promql_findings(["sum(rate(x[1m])", "rate(x[1m)]", ""]) != []
    assert len(dv.promql_findings(["sum(rate(x[1m])", "rate(x[1m)]", ""])) == 3


# -- deploy/gpu_check.py on a CPU-only machine -----------------------------------------------------
def test_gpu_check_says_what_to_install_without_gpu_providers() -> None:
    with pytest.raises(gpu_check.NoGpuProviderError, match=r"onnxruntime-gpu==1\.32\.0"):
        gpu_check.gpu_providers(["AzureExecutionProvider", gpu_check.CPU])
    assert gpu_check.gpu_providers([gpu_check.CPU, gpu_check.CUDA, gpu_check.TENSORRT]) == [
        gpu_check.TENSORRT,
        gpu_check.CUDA,
    ]


def test_gpu_check_main_exits_2_when_no_gpu(caplog: pytest.LogCaptureFixture) -> None:
    import onnxruntime as ort

    if any(p in ort.get_available_providers() for p in gpu_check.GPU_PROVIDERS):
        pytest.skip(reason="this machine has a GPU execution provider")
    assert gpu_check.main(["--models", "encoder_fp32"]) == gpu_check.EXIT_NO_GPU
    assert "no GPU execution provider" in caplog.text  # logged at ERROR


def test_parity_measures_cosine_and_abs_diff() -> None:
    ref = np.array([[1.0, 0.0], [0.0, 2.0]], dtype=np.float32)
    same = gpu_check.parity(ref, ref.copy())
    assert same.max_abs_diff == 0.0 and same.min_cosine == pytest.approx(1.0) and same.ok()
    flipped = gpu_check.parity(ref, np.array([[1.0, 0.0], [0.0, -2.0]], dtype=np.float32))
    assert flipped.min_cosine == pytest.approx(-1.0) and not flipped.ok()
    assert flipped.max_abs_diff == pytest.approx(4.0)
    with pytest.raises(gpu_check.GpuCheckError, match="shape"):
        gpu_check.parity(ref, ref[:1])


def test_make_feeds_builds_a_padded_bert_batch() -> None:
    inputs = [(n, "tensor(int64)") for n in ("input_ids", "attention_mask", "token_type_ids")]
    feeds = gpu_check.make_feeds(inputs, batch=5, seq_len=16, seed=1)
    assert {k: v.shape for k, v in feeds.items()} == {n: (5, 16) for n, _ in inputs}
    mask = feeds["attention_mask"]
    assert mask[:, 0].all() and set(np.unique(mask)) <= {0, 1}
    assert (np.diff(mask, axis=1) <= 0).all()  # right padding
    assert (feeds["input_ids"][mask == 0] == 0).all() and (feeds["input_ids"][mask == 1] > 0).all()
    assert not feeds["token_type_ids"].any()
    with pytest.raises(gpu_check.GpuCheckError, match="int64"):
        gpu_check.make_feeds([("x", "tensor(float)")], 1, 1)


def test_check_model_cpu_against_cpu(tmp_path: Path) -> None:
    model = _tiny_encoder(tmp_path / "encoder_tiny" / "1" / "model.onnx")
    results = gpu_check.check_model(model, [gpu_check.CPU], 4, 8, 3, tmp_path)
    assert [r.provider for r in results] == [gpu_check.CPU, gpu_check.CPU]
    assert results[0].parity is None
    assert results[1].parity is not None and results[1].parity.max_abs_diff == 0.0
    assert results[1].latency.iterations == 3
    assert "encoder_tiny" in results[1].row(gpu_check.DEFAULT_MIN_COSINE)
    with pytest.raises(gpu_check.ModelMissingError, match="make export"):
        gpu_check.check_model(tmp_path / "nope.onnx", [], 1, 1, 1, tmp_path)


def test_the_standalone_front_takes_the_deployments_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    """The flags compose and k8s give the sidecar front parse (``--traced=true`` turns the
    tracing mitigation on; ``--model-repository`` the /v1 routes)."""
    from tritonforge.runtime.front import app as front_module

    compose = dv.load_yaml(dv.COMPOSE_FILE)
    args = dv.front_args([str(a) for a in compose["services"]["front"]["command"]]) or []
    assert "--traced=true" in args and "--model-repository=/models" in args
    seen: dict[str, object] = {}

    class StopError(Exception):
        pass

    def fake_front(*_: object, **kwargs: object) -> object:
        seen.update(kwargs)
        raise StopError

    monkeypatch.setattr(front_module, "Front", fake_front)
    with pytest.raises(StopError):  # /models is not here: without it the flags are the deployments'
        front_module.main([a for a in args if not a.startswith("--model-repository")])
    assert seen["traced"] is True
    with pytest.raises(SystemExit):
        front_module.main(["--socket-dir=/tmp", "--traced=maybe"])
