"""The tenants' gate: who is calling (a key), may they call this model, are they within their
rates and quotas; and what each one used (requests, prompt and completion tokens, refusals).

The file is re-read when its modification time changes (checked at most every
``reload_interval_s``, or at once with :meth:`TenantGate.reload`, e.g. on SIGHUP): a revoked key
is refused from then on; the buckets, quotas and usage of the tenants that remain are kept. A
file that no longer parses keeps the previous tenants (and says so in the log).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tritonforge.runtime.errors import FrontError
from tritonforge.runtime.tenants.keys import Tenant, TenantsFileError, hash_key, load_tenants
from tritonforge.runtime.tenants.limits import Clock, Quota, TokenBucket

log = logging.getLogger(__name__)

USAGE_FIELDS = ("requests", "prompt_tokens", "completion_tokens", "refusals")


class TenantRefusedError(FrontError):
    """Refused at the gate: ``status`` 401 (no or unknown key), 403 (model not allowed) or 429
    (past a limit, with ``retry_after_s``); ``code`` a short machine-readable reason."""

    def __init__(self, message: str, status: int, code: str, retry_after_s: float = 0.0) -> None:
        super().__init__(message, status)
        self.code, self.retry_after_s = code, retry_after_s


@dataclass
class TenantState:
    """One tenant's live limits and usage."""

    tenant: Tenant
    requests: TokenBucket | None = None
    tokens: TokenBucket | None = None
    token_quota: Quota | None = None
    request_quota: Quota | None = None
    usage: dict[str, int] = field(default_factory=lambda: dict.fromkeys(USAGE_FIELDS, 0))

    @classmethod
    def of(cls, tenant: Tenant, clock: Clock, wall_clock: Clock) -> TenantState:
        t = tenant
        return cls(
            t,
            TokenBucket(t.requests_per_s, t.request_burst or t.requests_per_s, clock)
            if t.requests_per_s
            else None,
            TokenBucket(t.tokens_per_s, t.token_burst or t.tokens_per_s, clock)
            if t.tokens_per_s
            else None,
            Quota(t.quota_tokens, t.quota_period_s, wall_clock) if t.quota_tokens else None,
            Quota(t.quota_requests, t.quota_period_s, wall_clock) if t.quota_requests else None,
        )


class TenantGate:
    """Admission by tenant (see the module docstring). ``clock`` (monotonic) drives the
    buckets, ``wall_clock`` the quota periods: both injectable for tests."""

    def __init__(
        self,
        path: Path,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
        reload_interval_s: float = 1.0,
    ) -> None:
        self.path = path
        self.clock, self.wall_clock = clock, wall_clock
        self.reload_interval_s = reload_interval_s
        self._lock = threading.Lock()
        self._states: dict[str, TenantState] = {}
        self._by_key: dict[str, str] = {}
        self._mtime_ns = -1
        self._checked_s = -float("inf")
        self.reload()

    # -- the file ------------------------------------------------------------------------------
    def reload(self) -> None:
        """Read the file now (:class:`TenantsFileError` at start-up; later, a bad file is
        logged and the tenants stay as they were)."""
        mtime_ns = self.path.stat().st_mtime_ns if self.path.exists() else -1
        tenants = load_tenants(self.path)
        with self._lock:
            self._states = {
                name: self._states[name]
                if name in self._states and self._states[name].tenant == tenant
                else self._carried(name, tenant)
                for name, tenant in tenants.items()
            }
            self._by_key = {k: n for n, t in tenants.items() for k in t.key_hashes}
            self._mtime_ns = mtime_ns

    def _carried(self, name: str, tenant: Tenant) -> TenantState:
        """A fresh state for ``tenant``, keeping its usage when it existed before."""
        state = TenantState.of(tenant, self.clock, self.wall_clock)
        if name in self._states:
            state.usage = self._states[name].usage
        return state

    def _maybe_reload(self) -> None:
        now = self.clock()
        if now - self._checked_s < self.reload_interval_s:
            return
        self._checked_s = now
        try:
            changed = self.path.stat().st_mtime_ns != self._mtime_ns
        except OSError:
            changed = False
        if not changed:
            return
        try:
            self.reload()
            log.info("tenants: reloaded %s (%d tenants)", self.path, len(self._states))
        except (TenantsFileError, OSError) as e:
            log.error("tenants: %s; keeping the previous tenants", e)

    # -- admission -----------------------------------------------------------------------------
    def admit(self, key: str | None, model: str | None) -> TenantState:
        """The caller's state when ``key`` may call ``model`` now (one request counted and
        spent); else :class:`TenantRefusedError`."""
        self._maybe_reload()
        if not key:
            raise TenantRefusedError(
                "an API key is required (this server has tenants)", 401, "no_key"
            )
        with self._lock:
            name = self._by_key.get(hash_key(key))
            if name is None:
                raise TenantRefusedError("unknown or revoked API key", 401, "invalid_api_key")
            state = self._states[name]
            try:
                self._check(state, model)
            except TenantRefusedError:
                state.usage["refusals"] += 1
                raise
            state.usage["requests"] += 1
            return state

    def check_model(self, key: str | None, model: str) -> None:
        """:class:`TenantRefusedError` (403) when the tenant of ``key`` may not call ``model``
        (a gRPC stream names its models per message, after :meth:`admit` counted the call)."""
        with self._lock:
            name = self._by_key.get(hash_key(key or ""))
            if name is None:
                raise TenantRefusedError("unknown or revoked API key", 401, "invalid_api_key")
            state = self._states[name]
            if not state.tenant.allows(model):
                state.usage["refusals"] += 1
                raise TenantRefusedError(
                    f"tenant {state.tenant.name!r} may not call model {model!r}",
                    403,
                    "model_not_allowed",
                )

    def _check(self, state: TenantState, model: str | None) -> None:
        t = state.tenant
        if model is not None and not t.allows(model):
            raise TenantRefusedError(
                f"tenant {t.name!r} may not call model {model!r}", 403, "model_not_allowed"
            )
        for quota, what in ((state.request_quota, "requests"), (state.token_quota, "tokens")):
            if quota is not None and quota.exhausted():
                raise TenantRefusedError(
                    f"tenant {t.name!r}: quota of {quota.limit} {what} per "
                    f"{quota.period_s:g} s used up",
                    429,
                    "quota_exceeded",
                    quota.reset_in_s(),
                )
        if state.tokens is not None:
            wait_s = state.tokens.take(0.0)  # in debt from the last answers: wait it out
            if wait_s > 0:
                raise TenantRefusedError(
                    f"tenant {t.name!r}: over {t.tokens_per_s:g} tokens/s", 429, "rate_limited",
                    wait_s,
                )  # fmt: skip
        if state.requests is not None:
            wait_s = state.requests.take(1.0)
            if wait_s > 0:
                raise TenantRefusedError(
                    f"tenant {t.name!r}: over {t.requests_per_s:g} requests/s", 429,
                    "rate_limited", wait_s,
                )  # fmt: skip
        if state.request_quota is not None:
            state.request_quota.charge(1)

    def record(self, state: TenantState, prompt_tokens: int, completion_tokens: int) -> None:
        """Charge a finished request's tokens to its tenant's bucket, quota and usage."""
        used = max(0, prompt_tokens) + max(0, completion_tokens)
        with self._lock:
            state.usage["prompt_tokens"] += max(0, prompt_tokens)
            state.usage["completion_tokens"] += max(0, completion_tokens)
            if state.tokens is not None:
                state.tokens.charge(used)
            if state.token_quota is not None:
                state.token_quota.charge(used)

    # -- reports -------------------------------------------------------------------------------
    def usage(self) -> dict[str, dict[str, int]]:
        """Tenant -> its usage counters (since the server started)."""
        with self._lock:
            return {name: dict(s.usage) for name, s in sorted(self._states.items())}

    def metrics(self) -> str:
        """Prometheus text: ``tritonforge_tenant_<field>_total{tenant=...}`` per usage field."""
        usage = self.usage()
        lines: list[str] = []
        for what in USAGE_FIELDS:
            metric = f"tritonforge_tenant_{what}_total"
            lines += [
                f"# HELP {metric} {what.replace('_', ' ')} per tenant (the front's tenants file)",
                f"# TYPE {metric} counter",
                *(f'{metric}{{tenant="{_label(n)}"}} {u[what]}' for n, u in usage.items()),
            ]
        return "\n".join(lines) + "\n"


def _label(value: str) -> str:
    return value[:128].replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
