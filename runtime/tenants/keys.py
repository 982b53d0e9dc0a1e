"""The tenants file (``serve --tenants FILE``): who may call the front, with what, how much.

TOML, one table per tenant::

    [tenants.acme]
    keys = ["sha256:9f86d0...", "sha256:..."]   # hashed: `tritonforge tenants hash-key`
    models = ["embed", "generate"]              # allowed models (absent: all)
    requests_per_s = 20.0                       # token bucket: rate and burst (absent: no limit)
    request_burst = 40
    tokens_per_s = 500.0                        # prompt + completion tokens (absent: no limit)
    token_burst = 2000
    quota_tokens = 1000000                      # per period (absent: none)
    quota_requests = 100000
    quota_period_s = 86400
    priority = 1                                # 1 is the highest; maps to Triton's priority

Keys are stored as ``sha256:<hex>`` of the key (never the key itself); a key of 32+ random bytes
needs no slow hash. Every problem is a :class:`TenantsFileError` naming the tenant and field.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tritonforge.runtime.errors import EmbeddedServerError

HASH_PREFIX = "sha256:"
_FIELDS = {
    "keys", "models", "requests_per_s", "request_burst", "tokens_per_s", "token_burst",
    "quota_tokens", "quota_requests", "quota_period_s", "priority",
}  # fmt: skip


class TenantsFileError(EmbeddedServerError):
    """The tenants file cannot be used; the message names the file, tenant and field."""


def hash_key(key: str) -> str:
    """What the tenants file stores for ``key``: ``sha256:<hex>``."""
    return HASH_PREFIX + hashlib.sha256(key.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Tenant:
    """One tenant's rights and limits (None: unlimited)."""

    name: str
    key_hashes: frozenset[str]
    models: frozenset[str] | None = None
    requests_per_s: float | None = None
    request_burst: float | None = None
    tokens_per_s: float | None = None
    token_burst: float | None = None
    quota_tokens: int | None = None
    quota_requests: int | None = None
    quota_period_s: float = 86400.0
    priority: int | None = None

    def allows(self, model: str) -> bool:
        return self.models is None or model in self.models


def _number(name: str, table: Mapping[str, Any], field: str, integer: bool = False) -> Any:
    value = table.get(field)
    if value is None:
        return None
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not math.isfinite(value) or value <= 0:
        kind = "a positive integer" if integer else "a positive number"
        raise TenantsFileError(f"tenant {name!r}: {field} must be {kind}, got {value!r}")
    return value


def _tenant(name: str, table: Any) -> Tenant:
    if not isinstance(table, dict):
        raise TenantsFileError(f"tenant {name!r}: expected a table of settings")
    unknown = sorted(set(table) - _FIELDS)
    if unknown:
        raise TenantsFileError(
            f"tenant {name!r}: unknown field(s) {', '.join(unknown)}; known: {sorted(_FIELDS)}"
        )
    keys = table.get("keys")
    if not isinstance(keys, list) or not keys:
        raise TenantsFileError(f"tenant {name!r}: keys must be a non-empty list of key hashes")
    for key in keys:
        if not (isinstance(key, str) and key.startswith(HASH_PREFIX) and len(key) == 71):
            raise TenantsFileError(
                f"tenant {name!r}: keys holds {str(key)[:12]!r}...: not a sha256:<64 hex> "
                "hash; store hashes, never keys (`tritonforge tenants hash-key`)"
            )
    models = table.get("models")
    if models is not None and not (
        isinstance(models, list) and all(isinstance(m, str) for m in models)
    ):
        raise TenantsFileError(f"tenant {name!r}: models must be a list of model names")
    rate, tokens = _number(name, table, "requests_per_s"), _number(name, table, "tokens_per_s")
    return Tenant(
        name,
        frozenset(keys),
        frozenset(models) if models is not None else None,
        rate,
        _number(name, table, "request_burst") or rate,
        tokens,
        _number(name, table, "token_burst") or tokens,
        _number(name, table, "quota_tokens", integer=True),
        _number(name, table, "quota_requests", integer=True),
        _number(name, table, "quota_period_s") or 86400.0,
        _number(name, table, "priority", integer=True),
    )


def parse_tenants(text: str, source: str = "tenants file") -> dict[str, Tenant]:
    """Tenant name -> :class:`Tenant` from the TOML ``text``; a key hash held by two tenants
    is refused."""
    try:  # here, not at the top: the Triton container's sidecar front runs Python 3.10
        import tomllib
    except ModuleNotFoundError as e:
        raise TenantsFileError(f"{source}: reading a tenants file needs Python 3.11+") from e
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TenantsFileError(f"{source}: not valid TOML: {e}") from e
    tables = data.get("tenants")
    if not isinstance(tables, dict) or not tables:
        raise TenantsFileError(f"{source}: expected [tenants.<name>] tables")
    tenants = {name: _tenant(name, table) for name, table in tables.items()}
    owner: dict[str, str] = {}
    for tenant in tenants.values():
        for key in tenant.key_hashes:
            if key in owner:
                raise TenantsFileError(
                    f"{source}: a key of tenant {tenant.name!r} is also {owner[key]!r}'s"
                )
            owner[key] = tenant.name
    return tenants


def load_tenants(path: Path) -> dict[str, Tenant]:
    try:
        text = path.read_text()
    except OSError as e:
        raise TenantsFileError(f"cannot read the tenants file {path}: {e.strerror}") from e
    return parse_tenants(text, str(path))
