"""``python -m tritonforge.deploy.validate`` / ``tritonforge deploy-check``: every check, printed
at once; exit status 1 when any has findings."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from tritonforge.deploy.names import manifest_name_findings
from tritonforge.deploy.validate.compose import compose_document, compose_findings, validate_compose
from tritonforge.deploy.validate.container_code import (
    FRONT_ENTRY,
    FRONT_FIRST_PARTY,
    IMPORT_NAMES,
    LOADTEST_IMPORTS,
    ContainerCode,
    container_code_findings,
    loadtest_code,
)
from tritonforge.deploy.validate.gpu_configs import (
    UNCHECKED_WITHOUT_GPU,
    gpu_config_dirs,
    gpu_config_findings,
    gpu_config_notes,
)
from tritonforge.deploy.validate.images import CONTAINER_PINS, image_link_findings, pin_findings
from tritonforge.deploy.validate.k8s import k8s_findings, kustomize_documents, validate_k8s
from tritonforge.deploy.validate.kserve import kserve_findings
from tritonforge.deploy.validate.monitoring import (
    adapter_rules,
    dashboard_queries,
    duration_findings,
    promql_findings,
)
from tritonforge.deploy.validate.paths import (
    COMPOSE_FILE,
    DEPLOY_DIR,
    K8S_DIR,
    KSERVE_DIR,
    LOADTEST_REQUIREMENTS,
    MODEL_REPOSITORY,
    TRITON_REQUIREMENTS,
)


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
        "triton image links": image_link_findings(),
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
    for note in (n for d in exported for n in gpu_config_notes(d)):
        print(f"     {note}")
    print("not checked without a GPU (none here; `make gpu-check` on a GPU host):")
    for item in UNCHECKED_WITHOUT_GPU:
        print(f"     - {item}")
    return 1 if failed else 0
