"""Tenants on the real embedded server (issue #36 item 4): ``serve --tenants FILE``, on HTTP v2,
gRPC and ``/v1``.

Two tenants on one front: the small one, past its request rate, gets 429 with ``Retry-After``
(OpenAI's error shape on ``/v1``) while the big one is served; no key or a revoked one (after the
file changed, without a restart) gets 401; health stays open; the usage shows on the admin
endpoint and on ``/metrics``. Quotas resetting and the buckets' arithmetic are unit tests
(tests/unit/test_tenants.py, injected clocks)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.integration.reliability import MINIMAL, linked_repository, text_inputs
from tritonforge.pipelines import repository_configs
from tritonforge.runtime.front.openai.catalog import EMBEDDING, catalog
from tritonforge.runtime.serving import serving
from tritonforge.runtime.tenants.grpc import TENANT_METADATA
from tritonforge.runtime.tenants.http import TENANT_HEADER, USAGE_PATH
from tritonforge.runtime.tenants.keys import hash_key

pytestmark = pytest.mark.integration

TENANTS = f"""
[tenants.small]
keys = ["{hash_key("small-key")}"]
requests_per_s = 0.001
request_burst = 2

[tenants.big]
keys = ["{hash_key("big-key")}", "{hash_key("big-key-2")}"]

[tenants.narrow]
keys = ["{hash_key("narrow-key")}"]
models = ["embed"]
"""
INFER = {"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": ["hi"]}]}


def test_two_tenants_limits_revocation_and_usage(tmp_path: Path) -> None:
    repo = linked_repository(tmp_path / "repo", MINIMAL)
    served = catalog(repository_configs(repo))
    embedding = next(m for m, s in served.items() if s.kind == EMBEDDING)
    path = tmp_path / "tenants.toml"
    path.write_text(TENANTS)
    with serving(repo, tenants_file=path) as server:
        base = f"http://{server.http_url}"
        infer = f"{base}/v2/models/embed/infer"

        def v2(key: str | None) -> requests.Response:
            headers = {TENANT_HEADER: key} if key else {}
            return requests.post(infer, json=INFER, headers=headers, timeout=60)

        assert [v2("small-key").status_code for _ in range(2)] == [200, 200]
        refused = v2("small-key")
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
        assert "small" in refused.json()["error"]
        assert [v2("big-key").status_code for _ in range(5)] == [200] * 5  # served meanwhile
        assert v2(None).status_code == 401 and v2("wrong").status_code == 401
        assert requests.get(f"{base}/v2/health/ready", timeout=10).status_code == 200

        def v1(key: str) -> requests.Response:
            return requests.post(
                f"{base}/v1/embeddings", json={"model": embedding, "input": "hi"},
                headers={"Authorization": f"Bearer {key}"}, timeout=60,
            )  # fmt: skip

        openai_refusal = v1("small-key")
        assert openai_refusal.status_code == 429 and openai_refusal.headers["Retry-After"]
        assert openai_refusal.json()["error"]["type"] == "rate_limit_error"
        served = v1("big-key-2")
        assert served.status_code == 200, served.text

        path.write_text(TENANTS.replace(f', "{hash_key("big-key-2")}"', ""))  # revoke
        os.utime(path, ns=(1, 10**18))
        time.sleep(1.5)  # the gate looks at the file at most once a second
        assert v1("big-key-2").status_code == 401
        assert v2("big-key").status_code == 200

        grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
        grpc_client.infer("embed", text_inputs(["hi"]), headers={TENANT_METADATA: "big-key"})
        for key, code in (("small-key", "RESOURCE_EXHAUSTED"), (None, "UNAUTHENTICATED")):
            with pytest.raises(InferenceServerException) as grpc_refused:
                grpc_client.infer(
                    "embed", text_inputs(["hi"]), headers={TENANT_METADATA: key} if key else None
                )
            assert code in str(grpc_refused.value.status()), grpc_refused.value
        narrow = {TENANT_METADATA: "narrow-key"}
        grpc_client.infer("embed", text_inputs(["hi"]), headers=narrow)
        with pytest.raises(InferenceServerException) as not_allowed:  # checked per message
            grpc_client.infer("tokenizer", text_inputs(["hi"]), headers=narrow)
        assert "PERMISSION_DENIED" in str(not_allowed.value.status()), not_allowed.value
        assert "may not call model 'tokenizer'" in str(not_allowed.value)
        grpc_client.close()

        usage = requests.get(f"{base}{USAGE_PATH}", headers=server.admin_headers, timeout=10)
        tenants = usage.json()["tenants"]
        assert tenants["small"]["refusals"] == 3 and tenants["small"]["requests"] == 2
        assert tenants["big"]["requests"] == 8 and tenants["big"]["prompt_tokens"] > 0
        assert requests.get(f"{base}{USAGE_PATH}", timeout=10).status_code == 403
        metrics = requests.get(f"http://{server.settings.client_host}:"
                               f"{server.settings.metrics_port}/metrics", timeout=10).text  # fmt: skip
        assert 'tritonforge_tenant_refusals_total{tenant="small"} 3' in metrics
