"""Vendor self-contained JSON schemas into ``deploy/schemas/`` (maintenance, not run by tests).

Sources are PyPI wheels fetched with ``pip download --no-deps`` (tests must not download):

* ``check-jsonschema==0.39.0``: ``builtin_schemas/vendor/compose-spec.json`` (the Compose
  Specification schema, Apache-2.0) -> ``deploy/schemas/compose-spec.json``.
* ``kubernetes-validate==1.37.0``: the ``vX.Y.0-local-strict`` schemas (Apache-2.0, strict =
  unknown fields rejected). Each kind's schema references one shared ``_definitions.json``
  (1.4 MB); we keep only the definitions a kind reaches, inlined under ``$defs``.

    pip download --no-deps -d /tmp/wheels check-jsonschema==0.39.0 kubernetes-validate==1.37.0
    python -m deploy.vendor_schemas /tmp/wheels
"""

from __future__ import annotations

import argparse
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"
K8S_VERSION = "v1.31.0"
K8S_KINDS = (
    "deployment-apps-v1",
    "service-v1",
    "persistentvolumeclaim-v1",
    "horizontalpodautoscaler-autoscaling-v2",
)
COMPOSE_MEMBER = "check_jsonschema/builtin_schemas/vendor/compose-spec.json"
DEFS_PREFIX = "/api/_definitions.json#/$defs/"


class VendorError(RuntimeError):
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("wheels", type=Path, help="folder with the downloaded wheels")
    args = parser.parse_args(argv)
    for path in vendor(args.wheels):
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
