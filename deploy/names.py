"""Model names in the deployment files, checked against the exported repository (``make
deploy-check``).

Manifests should not name models (the liveness probe discovers them: :mod:`tritonforge.canary`);
what one still contains must agree with the repository's configs:

- a ``/v2/models/<name>/...`` path must be a model of the repository;
- a Prometheus selector ``model=~"<regex>"`` (or ``model="<name>"``) must select whole roles of the
  pipelines (``tritonforge.role``: every encoder, say, of every pipeline, and nothing else), so a
  new pipeline's models are never silently left out of an autoscaling or alerting rule.

Without an exported repository nothing is checked (``make export`` first).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable
from pathlib import Path

from tritonforge.errors import ModelConfigError
from tritonforge.pipelines import ROLE_KEY
from tritonforge.repository import load_model_config, model_names

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
_PATH = re.compile(r"/v2/models/([A-Za-z0-9_.-]+)/")
_SELECTOR = re.compile(r'\bmodel\s*(=~|=)\s*\\?"([^"$\\]+)\\?"')


def manifests(deploy_dir: Path, extra: Iterable[Path] = ()) -> list[Path]:
    """The deployment files (not the vendored schemas)."""
    found = [
        p
        for p in sorted(deploy_dir.rglob("*"))
        if p.suffix in MANIFEST_SUFFIXES and "schemas" not in p.relative_to(deploy_dir).parts
    ]
    return [*found, *(p for p in extra if p.is_file())]


def roles(repository: Path) -> dict[str, str]:
    """Model -> its ``tritonforge.role`` ("" for models outside any pipeline)."""
    out: dict[str, str] = {}
    for name in model_names(repository):
        with contextlib.suppress(ModelConfigError):
            out[name] = load_model_config(repository, name).parameters.get(ROLE_KEY, "")
    return out


def selector_findings(where: str, op: str, pattern: str, by_role: dict[str, str]) -> list[str]:
    """A selector must match at least one model and every model of each role it matches."""
    try:
        regex = re.compile(pattern if op == "=~" else re.escape(pattern))
    except re.error as e:
        return [f"{where}: model{op}{pattern!r} is not a regex: {e}"]
    matched = {m for m in by_role if regex.fullmatch(m)}  # Prometheus anchors label regexes
    if not matched:
        return [f"{where}: model{op}{pattern!r} matches no model of the repository"]
    out = []
    for role in sorted({by_role[m] for m in matched}):
        missed = sorted(m for m, r in by_role.items() if r == role and m not in matched)
        if not role:
            continue
        if missed:
            out.append(f"{where}: model{op}{pattern!r} selects some {role} models but not {missed}")
    return out


def manifest_name_findings(
    repository: Path, deploy_dir: Path, extra: Iterable[Path] = ()
) -> list[str]:
    """Every model name or selector in the deployment files that disagrees with ``repository``."""
    by_role = roles(repository) if repository.is_dir() else {}
    if not any(by_role.values()):
        return []  # not exported: nothing to check against
    out: list[str] = []
    for path in manifests(deploy_dir, extra):
        text = path.read_text(encoding="utf-8")
        where = path.name
        for name in sorted(set(_PATH.findall(text))):
            if name not in by_role:
                out.append(f"{where}: /v2/models/{name}/ is not a model of {repository.name}")
        for op, pattern in sorted(set(_SELECTOR.findall(text))):
            out += selector_findings(where, op, pattern, by_role)
    return out
