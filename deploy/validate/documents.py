"""Reading the deployment files: YAML, compose-style interpolation, vendored JSON schemas, and
the values they hold (sizes, durations, ``--flag=value`` lists). The package's error lives here."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from tritonforge.deploy.errors import DeployError

_VAR = re.compile(r"\$(?:\$|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\})")


class DeployCheckError(DeployError):
    """A deployment file is missing or cannot be read at all."""


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


def schema_errors(instance: Any, schema: Mapping[str, Any], where: str) -> list[str]:
    validator = jsonschema.Draft202012Validator(schema)
    return [
        f"{where}: {'/'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
        for e in sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))
    ]


def load_schema(path: Path) -> dict[str, Any]:
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


def size_bytes(value: str | int) -> int:
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"(\d+)\s*([kmg]?)b?", value.strip().lower())
    if not m:
        raise DeployCheckError(f"cannot read the size {value!r}")
    return int(m.group(1)) * {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[m.group(2)]


def seconds(value: str | int | float) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)?", str(value).strip())
    if not m:
        raise DeployCheckError(f"cannot read the duration {value!r}")
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, None: 1}[m.group(2)]
