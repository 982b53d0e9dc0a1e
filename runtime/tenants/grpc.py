"""The tenants' gate on the front's gRPC relay: the key in the :data:`TENANT_METADATA` metadata of
``ModelInfer`` and ``ModelStreamInfer`` calls (once per call); a refusal aborts the call with
``UNAUTHENTICATED`` (no or unknown key) or ``RESOURCE_EXHAUSTED`` (past a limit; the details end
with "retry after N s"); a model the tenant may not call, per request message, ``PERMISSION_DENIED``
(:func:`check_model`)."""

from __future__ import annotations

import math
from typing import Any

import grpc

from tritonforge.runtime.tenants.gate import TenantGate, TenantRefusedError
from tritonforge.runtime.tenants.http import TENANT_HEADER
from tritonforge.runtime.tenants.keys import Tenant

TENANT_METADATA = TENANT_HEADER.lower()
_CODES = {
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


async def admit_call(gate: TenantGate, context: Any) -> Tenant:
    """Admit one gRPC inference call by its tenant key, else abort it (see the docstring); the
    tenant (the relay puts its priority on each request as ``queue_priority``, its name into
    ``cache_salt``)."""
    key = dict(context.invocation_metadata() or ()).get(TENANT_METADATA)
    try:
        return gate.admit(key, None).tenant
    except TenantRefusedError as e:
        details = str(e)
        if e.status == 429:
            details += f"; retry after {max(1, math.ceil(e.retry_after_s))} s"
        await context.abort(_CODES.get(e.status, grpc.StatusCode.PERMISSION_DENIED), details)
        raise  # unreachable: abort raises


def check_model(gate: TenantGate, context: Any, model: str) -> None:
    """Refuse (:class:`TenantRefusedError`, 403) a request message to a model the call's tenant
    may not call; the relay aborts the call with ``PERMISSION_DENIED``."""
    gate.check_model(dict(context.invocation_metadata() or ()).get(TENANT_METADATA), model)
