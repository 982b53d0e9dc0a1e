"""The tenants' gate in front of the front's HTTP handler (``serve --tenants FILE``).

Gated: ``/v1/*`` (key: ``Authorization: Bearer <key>``; a refusal in OpenAI's error shape) and
``/v2/models/...`` (key: the :data:`TENANT_HEADER` header; a refusal as ``{"error": ...}``). Health,
server metadata and the admin APIs are not gated. A refusal past a limit is 429 with
``Retry-After``; an unknown or revoked key 401; a model the tenant may not call 403. A tenant's
``priority`` becomes the request's ``X-Priority`` (Triton's request priority, where the model's
batcher has levels; a client's own is overwritten) and the ``queue_priority`` of its requests on
every path (v2 ``infer``/``generate``/SSE, ``/v1``; gRPC in :mod:`.grpc`: the generate model's
queue order, put on by the stream session; a client-sent one is refused). A ``/v1`` answer is
charged its prompt and completion tokens, streamed or not. ``GET`` :data:`USAGE_PATH` (with the admin key)
answers every tenant's usage as JSON; ``/metrics`` carries the same counters. Without a tenants
file nothing here runs: the front behaves exactly as before.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import streams, web

from tritonforge.runtime.front.degrade_headers import PRIORITY_HEADER
from tritonforge.runtime.front.guard import QUEUE_PRIORITY_KEY, TENANT_KEY, USAGE_KEY, admin_ok
from tritonforge.runtime.tenants.gate import TenantGate, TenantRefusedError, TenantState

TENANT_HEADER = "X-Api-Key"
USAGE_PATH = "/admin/tenants/usage"
OPENAI_PREFIX = "/v1"
Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


def _bearer(value: str | None) -> str | None:
    if value is None:
        return None
    scheme, _, token = value.strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def _v2_model(path: str) -> str | None:
    parts = path.split("/")
    return parts[3] if len(parts) > 3 and parts[1:3] == ["v2", "models"] and parts[3] else None


def _refusal(e: TenantRefusedError, openai: bool) -> web.Response:
    headers = {"Retry-After": str(max(1, math.ceil(e.retry_after_s)))} if e.status == 429 else {}
    if openai:
        kind = {401: "authentication_error", 403: "permission_error"}.get(
            e.status, "rate_limit_error"
        )
        body: dict[str, Any] = {
            "error": {"message": str(e), "type": kind, "param": None, "code": e.code}
        }
    else:
        body = {"error": str(e)}
    return web.json_response(body, status=e.status, headers=headers)


def _usage_tokens(response: web.StreamResponse) -> tuple[int, int]:
    """(prompt, completion) tokens of a non-streamed ``/v1`` answer's ``usage`` (0, 0 else)."""
    body = getattr(response, "body", None)
    if response.status != 200 or not isinstance(body, bytes):
        return 0, 0
    try:
        usage = json.loads(body).get("usage") or {}
        return int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    except (ValueError, AttributeError, TypeError):
        return 0, 0


class TenantHttp:
    """Wraps the front's handler ``inner`` with the gate (see the module docstring)."""

    def __init__(
        self,
        gate: TenantGate,
        inner: Handler,
        admin_key: str | None,
        admin_header: str,
        max_body_bytes: int,
    ) -> None:
        self.gate, self.inner = gate, inner
        self.admin_key, self.admin_header = admin_key, admin_header
        self.max_body_bytes = max_body_bytes

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.path
        if path == USAGE_PATH:
            return self._usage(request)
        openai = path == OPENAI_PREFIX or path.startswith(OPENAI_PREFIX + "/")
        model = _v2_model(path)
        if not openai and model is None:
            return await self.inner(request)
        if openai:
            key = _bearer(request.headers.get("Authorization"))
            request, model = await self._openai_model(request)
        else:
            key = request.headers.get(TENANT_HEADER)
        try:
            state = self.gate.admit(key, model)
        except TenantRefusedError as e:
            return _refusal(e, openai)
        request = self._prioritized(request, state, openai)
        if state.tenant.priority is not None:  # generate's queue order (QUEUE_PRIORITY_KEY)
            request[QUEUE_PRIORITY_KEY] = state.tenant.priority
        request[TENANT_KEY] = state.tenant.name  # the prefix cache's salt (set_cache_salt)
        used: list[tuple[int, int]] = []  # the /v1 routes note a completion's tokens here
        request[USAGE_KEY] = used
        response = await self.inner(request)
        if openai:  # a streamed answer's tokens are noted; a non-streamed one's are in its body
            self.gate.record(state, *(used[-1] if used else _usage_tokens(response)))
        return response

    def _usage(self, request: web.BaseRequest) -> web.Response:
        if self.admin_key is not None and not admin_ok(
            request.headers.get(self.admin_header), self.admin_key
        ):
            return web.json_response(
                {"error": f"send the admin key in the {self.admin_header} header"}, status=403
            )
        return web.json_response({"tenants": self.gate.usage()})

    async def _openai_model(self, request: web.BaseRequest) -> tuple[web.BaseRequest, str | None]:
        """The ``model`` a ``/v1`` POST names, and a request the front can read the body of
        again (the body is read here, bounded; an unreadable one is left to the front)."""
        if request.method != "POST" or (request.content_length or 0) > self.max_body_bytes:
            return request, None
        chunks, size = [], 0
        async for chunk in request.content.iter_any():
            chunks.append(chunk)
            size += len(chunk)
            if size > self.max_body_bytes:
                break  # the front answers 413 for what is left
        body = b"".join(chunks)
        replay = streams.StreamReader(request.protocol, 2**16, loop=request.loop)
        replay.feed_data(body)
        replay.feed_eof()
        clone = request.clone()
        clone._payload = replay  # aiohttp reads the body from here; a clone shares it
        try:
            named = json.loads(body).get("model")
        except (ValueError, AttributeError):
            named = None
        return clone, named if isinstance(named, str) else None

    def _prioritized(
        self, request: web.BaseRequest, state: TenantState, openai: bool
    ) -> web.BaseRequest:
        priority = state.tenant.priority
        if openai or priority is None:
            return request
        headers = request.headers.copy()
        headers[PRIORITY_HEADER] = str(priority)  # replaces a client's, whatever its case
        return request.clone(headers=headers)
