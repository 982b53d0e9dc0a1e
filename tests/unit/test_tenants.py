"""Tenants (issue #36 item 4), the pure parts: the file, the buckets and quotas on injected
clocks, the gate's decisions and a reload that revokes a key."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from tritonclient.grpc import service_pb2

from tritonforge.generation import CACHE_SALT_PARAMETER, QUEUE_PRIORITY_PARAMETER
from tritonforge.runtime.errors import FrontError
from tritonforge.runtime.front.guard import (
    QUEUE_PRIORITY_KEY,
    TENANT_KEY,
    USAGE_KEY,
    set_cache_salt,
    set_queue_priority,
    tenant_salt,
)
from tritonforge.runtime.tenants.__main__ import main as tenants_main
from tritonforge.runtime.tenants.gate import TenantGate, TenantRefusedError
from tritonforge.runtime.tenants.http import TenantHttp
from tritonforge.runtime.tenants.keys import TenantsFileError, hash_key, parse_tenants
from tritonforge.runtime.tenants.limits import Quota, TokenBucket


def _file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "tenants.toml"
    path.write_text(body)
    return path


TWO = f"""
[tenants.small]
keys = ["{hash_key("small-key")}"]
models = ["embed"]
requests_per_s = 1.0
request_burst = 2
quota_requests = 3
quota_period_s = 60

[tenants.big]
keys = ["{hash_key("big-key")}", "{hash_key("big-key-2")}"]
priority = 1
tokens_per_s = 10.0
token_burst = 10
"""


def test_the_file_parses_and_every_problem_names_the_tenant_and_field() -> None:
    tenants = parse_tenants(TWO)
    assert tenants["small"].models == frozenset({"embed"}) and tenants["big"].models is None
    assert tenants["small"].request_burst == 2 and tenants["big"].priority == 1
    with pytest.raises(TenantsFileError, match="'x': keys holds 'plaintext'"):
        parse_tenants('[tenants.x]\nkeys = ["plaintext"]')
    with pytest.raises(TenantsFileError, match="'x': requests_per_s must be a positive number"):
        parse_tenants(f'[tenants.x]\nkeys = ["{hash_key("k")}"]\nrequests_per_s = -1')
    with pytest.raises(TenantsFileError, match="'x': unknown field"):
        parse_tenants(f'[tenants.x]\nkeys = ["{hash_key("k")}"]\nrps = 1')
    with pytest.raises(TenantsFileError, match="also 'a''s"):
        parse_tenants(
            f'[tenants.a]\nkeys = ["{hash_key("k")}"]\n[tenants.b]\nkeys = ["{hash_key("k")}"]'
        )
    with pytest.raises(TenantsFileError, match="not valid TOML"):
        parse_tenants("[tenants")


def test_a_token_bucket_refills_at_its_rate_and_says_how_long_to_wait() -> None:
    now = [0.0]
    bucket = TokenBucket(2.0, 4.0, clock=lambda: now[0])
    assert [bucket.take() for _ in range(4)] == [0.0] * 4
    assert bucket.take() == pytest.approx(0.5)
    now[0] = 0.5
    assert bucket.take() == 0.0
    bucket.charge(3.0)  # into debt: the next take waits it out
    assert bucket.take(0.0) == pytest.approx(1.5)


def test_a_quota_runs_out_and_resets_with_the_next_period() -> None:
    now = [1000.0]
    quota = Quota(2, 60.0, clock=lambda: now[0])
    quota.charge(2)
    assert quota.exhausted() and quota.reset_in_s() == pytest.approx(20.0)
    now[0] = 1020.0
    assert not quota.exhausted() and quota.used == 0


def test_two_tenants_one_at_its_limit_is_refused_while_the_other_is_served(
    tmp_path: Path,
) -> None:
    now, wall = [0.0], [0.0]
    gate = TenantGate(_file(tmp_path, TWO), lambda: now[0], lambda: wall[0])
    gate.admit("small-key", "embed")
    gate.admit("small-key", "embed")
    with pytest.raises(TenantRefusedError) as refused:
        gate.admit("small-key", "embed")
    assert refused.value.status == 429 and refused.value.retry_after_s == pytest.approx(1.0)
    for _ in range(20):
        gate.admit("big-key", "generate")  # no request limit: served
    with pytest.raises(TenantRefusedError, match="may not call model 'generate'") as other:
        gate.admit("small-key", "generate")
    assert other.value.status == 403
    with pytest.raises(TenantRefusedError) as unknown:
        gate.admit("nobody", "embed")
    assert unknown.value.status == 401
    now[0] = 10.0  # refilled; the quota (3 per minute) has one request left
    gate.admit("small-key", "embed")
    with pytest.raises(TenantRefusedError, match="quota of 3 requests") as quota:
        gate.admit("small-key", "embed")
    assert quota.value.retry_after_s == pytest.approx(60.0)
    wall[0] = 60.0  # the next period
    gate.admit("small-key", "embed")
    usage = gate.usage()
    assert usage["small"]["requests"] == 4 and usage["small"]["refusals"] == 3
    assert usage["big"]["requests"] == 20
    assert 'tritonforge_tenant_refusals_total{tenant="small"} 3' in gate.metrics()


def test_tokens_are_charged_after_the_answer_and_a_tenant_in_debt_waits(tmp_path: Path) -> None:
    now = [0.0]
    gate = TenantGate(_file(tmp_path, TWO), lambda: now[0])
    state = gate.admit("big-key", None)
    gate.record(state, prompt_tokens=12, completion_tokens=8)  # 20 of a 10-token burst
    with pytest.raises(TenantRefusedError, match="tokens/s") as refused:
        gate.admit("big-key-2", None)
    assert refused.value.retry_after_s == pytest.approx(1.0)
    assert gate.usage()["big"]["prompt_tokens"] == 12


def test_a_revoked_key_is_refused_after_the_file_changes(tmp_path: Path) -> None:
    now = [0.0]
    path = _file(tmp_path, TWO)
    gate = TenantGate(path, lambda: now[0])
    gate.admit("big-key-2", None)
    path.write_text(TWO.replace(f', "{hash_key("big-key-2")}"', ""))
    os.utime(path, ns=(1, 10**18))  # a new mtime whatever the file system's resolution
    now[0] = 2.0  # past the reload interval
    with pytest.raises(TenantRefusedError, match="revoked") as refused:
        gate.admit("big-key-2", None)
    assert refused.value.status == 401
    gate.admit("big-key", None)
    assert gate.usage()["big"]["requests"] == 2  # usage kept across the reload
    path.write_text("[tenants")  # broken: the previous tenants stay
    os.utime(path, ns=(1, 2 * 10**18))
    now[0] = 4.0
    gate.admit("big-key", None)


def test_the_cli_hashes_a_key_from_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("small-key\n"))
    assert tenants_main(["hash-key"]) == 0
    assert capsys.readouterr().out.strip() == hash_key("small-key")


def test_a_grpc_message_to_a_model_the_tenant_may_not_call_is_refused(tmp_path: Path) -> None:
    """gRPC names its models per request message: checked after the call was admitted."""
    gate = TenantGate(_file(tmp_path, TWO), lambda: 0.0)
    gate.check_model("small-key", "embed")
    with pytest.raises(TenantRefusedError, match="may not call model 'generate'") as refused:
        gate.check_model("small-key", "generate")
    assert refused.value.status == 403 and gate.usage()["small"]["refusals"] == 1
    gate.check_model("big-key", "generate")  # no list of models: every one
    with pytest.raises(TenantRefusedError) as unknown:
        gate.check_model(None, "embed")
    assert unknown.value.status == 401


def test_the_queue_priority_is_the_servers_to_set() -> None:
    """The tenant's priority reaches generate's queue as ``queue_priority``; a client's own is
    refused (400 naming it), never forwarded."""
    message = service_pb2.ModelInferRequest(model_name="generate")
    set_queue_priority(message, 2)
    assert message.parameters[QUEUE_PRIORITY_PARAMETER].int64_param == 2
    with pytest.raises(FrontError, match=QUEUE_PRIORITY_PARAMETER) as refused:
        set_queue_priority(message, 1)  # it carries one already
    assert refused.value.status == 400
    plain = service_pb2.ModelInferRequest(model_name="generate")
    set_queue_priority(plain, None)
    assert QUEUE_PRIORITY_PARAMETER not in plain.parameters


def test_the_cache_salt_always_holds_the_tenant() -> None:
    """With tenants, a request's ``cache_salt`` becomes a digest of its tenant and the client's
    own salt: no client of another tenant can send it; without tenants it goes on as sent."""
    plain = service_pb2.ModelInferRequest(model_name="generate")
    set_cache_salt(plain, "a")
    assert plain.parameters[CACHE_SALT_PARAMETER].string_param == tenant_salt("a", "")
    own = service_pb2.ModelInferRequest(model_name="generate")
    own.parameters[CACHE_SALT_PARAMETER].string_param = "user-1"
    untouched = service_pb2.ModelInferRequest()
    untouched.CopyFrom(own)
    set_cache_salt(untouched, None)
    assert untouched.parameters[CACHE_SALT_PARAMETER].string_param == "user-1"
    set_cache_salt(own, "a")
    salted = own.parameters[CACHE_SALT_PARAMETER].string_param
    assert salted == tenant_salt("a", "user-1") and len(salted) == 64
    assert len({tenant_salt("a", "user-1"), tenant_salt("b", "user-1"), tenant_salt("a", "")}) == 3
    forged = service_pb2.ModelInferRequest(model_name="generate")
    forged.parameters[CACHE_SALT_PARAMETER].string_param = tenant_salt("a", "user-1")
    set_cache_salt(forged, "b")  # b sends a's salt: it lands in b's own namespace
    assert forged.parameters[CACHE_SALT_PARAMETER].string_param != tenant_salt("a", "user-1")
    for bad in ("int64_param", "string_param"):
        message = service_pb2.ModelInferRequest(model_name="generate")
        if bad == "int64_param":
            message.parameters[CACHE_SALT_PARAMETER].int64_param = 3
        else:
            message.parameters[CACHE_SALT_PARAMETER].string_param = "x" * 513
        with pytest.raises(FrontError, match=CACHE_SALT_PARAMETER) as refused:
            set_cache_salt(message, "a")
        assert refused.value.status == 400


def test_the_gate_passes_the_priority_and_charges_a_streamed_answers_tokens(
    tmp_path: Path,
) -> None:
    """A streamed ``/v1`` answer has no ``usage`` body: the route notes its tokens in the
    request (``USAGE_KEY``) and the gate charges them; the tenant's priority rides along."""
    gate = TenantGate(_file(tmp_path, TWO), lambda: 0.0)
    seen: list[object] = []

    async def stream_route(request: web.BaseRequest) -> web.StreamResponse:
        seen.append(request.get(QUEUE_PRIORITY_KEY))
        seen.append(request.get(TENANT_KEY))
        request[USAGE_KEY].append((5, 7))
        return web.StreamResponse()  # streamed: nothing in a body to read

    http = TenantHttp(gate, stream_route, None, "x-admin", 1024)

    async def call() -> None:
        headers = {"Authorization": "Bearer big-key"}
        await http.handle(make_mocked_request("GET", "/v1/models", headers=headers))

    asyncio.run(call())
    assert seen == [1, "big"]
    usage = gate.usage()["big"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (5, 7)
