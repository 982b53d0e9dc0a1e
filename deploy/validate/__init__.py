"""Offline checks of the deployment files (no Docker engine, no cluster, no GPU needed).

One module per concern (``paths``, ``documents``, ``launcher``, ``compose``, ``k8s``,
``kserve``, ``monitoring``, ``images``, ``container_code``, ``gpu_configs``; ``cli`` runs them
all); this package re-exports their names. Every check returns a list of findings (empty = fine) so that tests assert on them and
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

from tritonforge.deploy.validate.cli import (
    all_findings,
    main,
)
from tritonforge.deploy.validate.compose import (
    compose_document,
    compose_findings,
    compose_front_findings,
    validate_compose,
)
from tritonforge.deploy.validate.container_code import (
    CONTAINER_PYTHON,
    FRONT_ENTRY,
    FRONT_FIRST_PARTY,
    IMPORT_NAMES,
    LOADTEST_IMPORTS,
    PY311_ONLY,
    ContainerCode,
    container_code_findings,
    default_locustfile,
    loadtest_code,
    module_file,
    module_imports,
)
from tritonforge.deploy.validate.documents import (
    DeployCheckError,
    interpolate,
    load_schema,
    load_yaml,
    load_yaml_all,
    schema_errors,
    seconds,
    size_bytes,
    triton_flags,
)
from tritonforge.deploy.validate.gpu_configs import (
    GPU_ACCELERATORS,
    NOT_TENSORRT_INT8,
    TRT_PRECISIONS,
    UNCHECKED_WITHOUT_GPU,
    gpu_config_dirs,
    gpu_config_findings,
    gpu_config_notes,
    onnx_signature,
    onnx_tensors,
    tensorrt_int8_findings,
    tensorrt_parameter_findings,
)
from tritonforge.deploy.validate.images import (
    CONTAINER_PINS,
    NGC_TRITON_RELEASES,
    dockerfile_installs,
    image_link_findings,
    ngc_tag,
    pin_findings,
    pins,
    triton_version_for_ngc_tag,
)
from tritonforge.deploy.validate.k8s import (
    K8S_SCHEMAS,
    by_kind,
    k8s_findings,
    k8s_front_findings,
    kustomize_documents,
    validate_k8s,
)
from tritonforge.deploy.validate.kserve import (
    KSERVE_HTTP_PORT,
    KSERVE_MODEL_DIR,
    KSERVE_OWN_FLAGS,
    kserve_findings,
)
from tritonforge.deploy.validate.launcher import (
    ADMIN_KEY_ENV,
    ADMIN_KEY_REF,
    DRAIN_MODULE,
    FRONT_COMMAND,
    RESTRICTED_FLAGS,
    drain_args,
    front_args,
    front_findings,
    launcher_flag_findings,
    triton_command,
)
from tritonforge.deploy.validate.monitoring import (
    METRIC_NAME,
    adapter_metric_aliases,
    adapter_rules,
    dashboard_queries,
    duration_findings,
    promql_findings,
    referenced_metrics,
)
from tritonforge.deploy.validate.paths import (
    ADAPTER_RULES,
    COMPOSE_FILE,
    CONSTRAINTS,
    DASHBOARD,
    DEPLOY_DIR,
    DOCKERFILE,
    K8S_DIR,
    K8S_SCHEMA_DIR,
    KSERVE_DIR,
    LOADTEST_REQUIREMENTS,
    MODEL_REPOSITORY,
    PROJECT_ROOT,
    SCHEMA_DIR,
    TRITON_REQUIREMENTS,
)

__all__ = [
    "ADAPTER_RULES",
    "ADMIN_KEY_ENV",
    "ADMIN_KEY_REF",
    "COMPOSE_FILE",
    "CONSTRAINTS",
    "CONTAINER_PINS",
    "CONTAINER_PYTHON",
    "DASHBOARD",
    "DEPLOY_DIR",
    "DOCKERFILE",
    "DRAIN_MODULE",
    "FRONT_COMMAND",
    "FRONT_ENTRY",
    "FRONT_FIRST_PARTY",
    "GPU_ACCELERATORS",
    "IMPORT_NAMES",
    "K8S_DIR",
    "K8S_SCHEMAS",
    "K8S_SCHEMA_DIR",
    "KSERVE_DIR",
    "KSERVE_HTTP_PORT",
    "KSERVE_MODEL_DIR",
    "KSERVE_OWN_FLAGS",
    "LOADTEST_IMPORTS",
    "LOADTEST_REQUIREMENTS",
    "METRIC_NAME",
    "MODEL_REPOSITORY",
    "NGC_TRITON_RELEASES",
    "NOT_TENSORRT_INT8",
    "PROJECT_ROOT",
    "PY311_ONLY",
    "RESTRICTED_FLAGS",
    "SCHEMA_DIR",
    "TRITON_REQUIREMENTS",
    "TRT_PRECISIONS",
    "UNCHECKED_WITHOUT_GPU",
    "ContainerCode",
    "DeployCheckError",
    "adapter_metric_aliases",
    "adapter_rules",
    "all_findings",
    "by_kind",
    "compose_document",
    "compose_findings",
    "compose_front_findings",
    "container_code_findings",
    "dashboard_queries",
    "default_locustfile",
    "dockerfile_installs",
    "drain_args",
    "duration_findings",
    "front_args",
    "front_findings",
    "gpu_config_dirs",
    "gpu_config_findings",
    "gpu_config_notes",
    "image_link_findings",
    "interpolate",
    "k8s_findings",
    "k8s_front_findings",
    "kserve_findings",
    "kustomize_documents",
    "launcher_flag_findings",
    "load_schema",
    "load_yaml",
    "load_yaml_all",
    "loadtest_code",
    "main",
    "module_file",
    "module_imports",
    "ngc_tag",
    "onnx_signature",
    "onnx_tensors",
    "pin_findings",
    "pins",
    "pre_stop_command",
    "promql_findings",
    "referenced_metrics",
    "schema_errors",
    "seconds",
    "size_bytes",
    "stop_budget_s",
    "tensorrt_int8_findings",
    "tensorrt_parameter_findings",
    "triton_command",
    "triton_flags",
    "triton_version_for_ngc_tag",
    "validate_compose",
    "validate_k8s",
]
