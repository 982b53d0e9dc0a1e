"""Vendor self-contained JSON schemas into ``deploy/schemas/`` (maintenance, not run by tests).

Sources are PyPI wheels fetched with ``pip download --no-deps`` (tests must not download):

* ``check-jsonschema==0.39.0``: ``builtin_schemas/vendor/compose-spec.json`` (the Compose
  Specification schema, Apache-2.0) -> ``deploy/schemas/compose-spec.json``.
* ``kubernetes-validate==1.37.0``: the ``vX.Y.0-local-strict`` schemas (Apache-2.0, strict =
  unknown fields rejected). Each kind's schema references one shared ``_definitions.json``
  (1.4 MB); we keep only the definitions a kind reaches, inlined under ``$defs``.

    pip download --no-deps -d /tmp/wheels check-jsonschema==0.39.0 kubernetes-validate==1.37.0
    python -m tritonforge.deploy.vendor_schemas /tmp/wheels
"""

from __future__ import annotations

import argparse
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tritonforge.deploy.errors import DeployError

SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"
K8S_VERSION = "v1.31.0"
K8S_KINDS = (
    "deployment-apps-v1",
    "service-v1",
    "persistentvolumeclaim-v1",
    "horizontalpodautoscaler-autoscaling-v2",
)
COMPOSE_MEMBER = "check_jsonschema/builtin_schemas/vendor/compose-spec.json"


class VendorError(DeployError):
    """A wheel or a schema inside it is not where this script expects it."""


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def _rewrite(node: Any) -> Any:
    """Point ``/api/_definitions.json#/$defs/X`` and ``#/$defs/X`` refs at the local ``$defs``."""
    if isinstance(node, dict):
        return {
            k: (
                "#/$defs/" + v.rsplit("/", 1)[-1]
                if k == "$ref" and isinstance(v, str)
                else _rewrite(v)
            )
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_rewrite(v) for v in node]
    return node


def self_contained(kind_schema: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    """``kind_schema`` with every definition it transitively references inlined under ``$defs``."""
    wanted: dict[str, Any] = {}
    todo = [r.rsplit("/", 1)[-1] for r in _refs(kind_schema)]
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        if name not in definitions:
            raise VendorError(
                f"definition {name!r} is referenced but missing from _definitions.json"
            )
        wanted[name] = definitions[name]
        todo += [r.rsplit("/", 1)[-1] for r in _refs(definitions[name])]
    out = _rewrite(kind_schema)
    out["$defs"] = _rewrite(dict(sorted(wanted.items())))
    return dict(out)


def _wheel(wheels: Path, prefix: str) -> zipfile.ZipFile:
    found = sorted(wheels.glob(f"{prefix}-*.whl"))
    if not found:
        raise VendorError(f"no {prefix}-*.whl in {wheels}; run the pip download in this docstring")
    return zipfile.ZipFile(found[-1])


def vendor(wheels: Path, target: Path = SCHEMA_DIR) -> list[Path]:
    """Write the compose and Kubernetes schemas under ``target``; returns the files written."""
    written: list[Path] = []
    with _wheel(wheels, "check_jsonschema") as cj:
        dst = target / "compose-spec.json"
        dst.write_bytes(cj.read(COMPOSE_MEMBER))
        written.append(dst)
    base = f"kubernetes_validate/kubernetes-json-schema/{K8S_VERSION}-local-strict"
    with _wheel(wheels, "kubernetes_validate") as kv:
        definitions = json.loads(kv.read(f"{base}/_definitions.json"))["$defs"]
        k8s_dir = target / "k8s" / K8S_VERSION
        k8s_dir.mkdir(parents=True, exist_ok=True)
        for kind in K8S_KINDS:
            schema = self_contained(json.loads(kv.read(f"{base}/{kind}.json")), definitions)
            dst = k8s_dir / f"{kind}.json"
            dst.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
            written.append(dst)
    return written


# -- KServe (hand-written subsets, made strict and self-contained) ---------------------------------
# The CRDs' full OpenAPI schemas are megabytes; these keep the fields deploy/kserve may use (from
# KServe's v1alpha1 ServingRuntimeSpec and v1beta1 InferenceServiceSpec) and reject the rest, with
# the Kubernetes parts (Container, Volume...) from the vendored strict 1.31 definitions.
_CORE = "#/$defs/io.k8s.api.core.v1."
_META = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "additionalProperties": False,
}
_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_PROTOCOLS = {"type": "string", "enum": ["v1", "v2", "grpc-v1", "grpc-v2"]}


def _kind(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"tritonforge/{kind.lower()}-{api_version.replace('/', '-')}",
        "description": f"Strict subset of KServe's {kind} ({api_version}) used by deploy/kserve.",
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": _META,
            "spec": spec,
        },
    }


def _serving_runtime() -> dict[str, Any]:
    return _kind(
        "serving.kserve.io/v1alpha1",
        "ServingRuntime",
        {
            "type": "object",
            "required": ["containers", "supportedModelFormats"],
            "additionalProperties": False,
            "properties": {
                "annotations": _STR_MAP,
                "labels": _STR_MAP,
                "disabled": {"type": "boolean"},
                "multiModel": {"type": "boolean"},
                "protocolVersions": {"type": "array", "items": _PROTOCOLS},
                "supportedModelFormats": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string"},
                            "version": {"type": "string"},
                            "autoSelect": {"type": "boolean"},
                            "priority": {"type": "integer", "minimum": 1},
                        },
                    },
                },
                "containers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {"$ref": _CORE + "Container"},
                },
                "volumes": {"type": "array", "items": {"$ref": _CORE + "Volume"}},
                "nodeSelector": _STR_MAP,
                "tolerations": {"type": "array", "items": {"$ref": _CORE + "Toleration"}},
                "imagePullSecrets": {
                    "type": "array",
                    "items": {"$ref": _CORE + "LocalObjectReference"},
                },
            },
        },
    )


def _inference_service(container: dict[str, Any]) -> dict[str, Any]:
    model = {
        "type": "object",
        "required": ["modelFormat"],
        "additionalProperties": False,
        # ModelSpec = the KServe fields + an inlined Container (name and image optional)
        "properties": {
            **{k: v for k, v in container["properties"].items()},
            "modelFormat": {
                "type": "object",
                "required": ["name"],
                "additionalProperties": False,
                "properties": {"name": {"type": "string"}, "version": {"type": "string"}},
            },
            "runtime": {"type": "string"},
            "protocolVersion": _PROTOCOLS,
            "storageUri": {
                "type": "string",
                "pattern": "^(pvc|s3|gs|https?|hdfs|webhdfs|oci)://",
            },
        },
    }
    predictor = {
        "type": "object",
        "required": ["model"],
        "additionalProperties": False,
        "properties": {
            "model": model,
            "minReplicas": {"type": "integer", "minimum": 0},
            "maxReplicas": {"type": "integer", "minimum": 0},
            "scaleMetric": {"type": "string", "enum": ["cpu", "memory", "concurrency", "rps"]},
            "scaleTarget": {"type": "integer", "minimum": 1},
            "containerConcurrency": {"type": "integer", "minimum": 0},
            "timeout": {"type": "integer", "minimum": 1},
            "serviceAccountName": {"type": "string"},
            "terminationGracePeriodSeconds": {"type": "integer", "minimum": 0},
            "securityContext": {"$ref": _CORE + "PodSecurityContext"},
            "volumes": {"type": "array", "items": {"$ref": _CORE + "Volume"}},
            "nodeSelector": _STR_MAP,
            "tolerations": {"type": "array", "items": {"$ref": _CORE + "Toleration"}},
        },
    }
    return _kind(
        "serving.kserve.io/v1beta1",
        "InferenceService",
        {
            "type": "object",
            "required": ["predictor"],
            "additionalProperties": False,
            "properties": {"predictor": predictor},
        },
    )


def kserve(target: Path = SCHEMA_DIR) -> list[Path]:
    """Write the KServe subsets, completed from the vendored Deployment schema's definitions."""
    deployment = json.loads((target / "k8s" / K8S_VERSION / "deployment-apps-v1.json").read_text())
    definitions = deployment["$defs"]
    container = dict(definitions["io.k8s.api.core.v1.Container"])
    container_optional = {**container, "required": []}
    written = []
    for name, schema in [
        ("servingruntime-serving.kserve.io-v1alpha1.json", _serving_runtime()),
        ("inferenceservice-serving.kserve.io-v1beta1.json", _inference_service(container_optional)),
    ]:
        dst = target / "k8s" / name
        dst.write_text(
            json.dumps(self_contained(schema, definitions), indent=1, sort_keys=True) + "\n"
        )
        written.append(dst)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("wheels", type=Path, nargs="?", help="folder with the downloaded wheels")
    parser.add_argument(
        "--kserve-only", action="store_true", help="only (re)write the KServe subsets"
    )
    args = parser.parse_args(argv)
    if not args.kserve_only and args.wheels is None:
        parser.error("give the wheels folder (or --kserve-only)")
    for path in ([] if args.kserve_only else vendor(args.wheels)) + kserve():
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
