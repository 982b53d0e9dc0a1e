"""The metrics the Grafana dashboard and the Prometheus adapter name: queries, PromQL sanity and
per-request durations divided the right way."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tritonforge.deploy.validate.documents import load_yaml
from tritonforge.deploy.validate.paths import ADAPTER_RULES, DASHBOARD

METRIC_NAME = re.compile(r"\b(nv_[a-z_]+)\b")


def adapter_rules(path: Path = ADAPTER_RULES) -> list[dict[str, Any]]:
    doc = load_yaml(path)
    rules: list[dict[str, Any]] = (doc.get("rules") or {}).get("custom") or []
    return rules


def adapter_metric_aliases(path: Path = ADAPTER_RULES) -> set[str]:
    return {str((r.get("name") or {}).get("as", "")) for r in adapter_rules(path)}


def dashboard_queries(path: Path = DASHBOARD) -> list[str]:
    dash = json.loads(path.read_text())
    queries = [t["expr"] for p in dash.get("panels", []) for t in p.get("targets", [])]
    for var in (dash.get("templating") or {}).get("list", []):
        query = var.get("query")
        queries.append(query.get("query", "") if isinstance(query, dict) else str(query or ""))
    return queries


def referenced_metrics(queries: list[str]) -> set[str]:
    """Triton metric names (``nv_*``) appearing in PromQL queries."""
    return {m for q in queries for m in METRIC_NAME.findall(q)}


def promql_findings(queries: list[str]) -> list[str]:
    """Cheap PromQL sanity: balanced brackets and no empty query (there is no PromQL parser here)."""
    out: list[str] = []
    pairs = {")": "(", "]": "[", "}": "{"}
    for q in queries:
        stack: list[str] = []
        for ch in q:
            if ch in "([{":
                stack.append(ch)
            elif ch in pairs and (not stack or stack.pop() != pairs[ch]):
                stack.append("!")
                break
        if stack or not q.strip():
            out.append(f"promql: unbalanced or empty query: {q!r}")
    return out


# Triton accumulates these per *request* (every request of a batch gets the batch's time): a mean
# divides them by a request count, never by nv_inference_exec_count (batch-size times too high).
_PER_REQUEST_DURATION = re.compile(r"nv_inference_(?:request|queue|compute_\w+)_duration_us")


def duration_findings(queries: list[str]) -> list[str]:
    """Means of per-request durations divided by the execution count."""
    return [
        f"promql: a per-request duration divided by nv_inference_exec_count: {q!r}"
        for q in queries
        if _PER_REQUEST_DURATION.search(q) and "nv_inference_exec_count" in q.split("/", 1)[-1]
    ]
