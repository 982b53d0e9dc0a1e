"""Where the deployment files are (the project checkout, or the installed package)."""

from __future__ import annotations

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
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
KSERVE_DIR = DEPLOY_DIR / "kserve"
