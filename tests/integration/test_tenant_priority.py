"""Tenant priority on every path to ``generate`` (issue #36 item 4), on the real embedded Triton.

One running slot, a long stream holding it: a low-priority tenant's request queues first, a
high-priority tenant's after it; over gRPC ``ModelStreamInfer`` with the key in the metadata the
high one is served first. A client-sent ``queue_priority`` is refused on gRPC (stream and
``ModelInfer``) and on HTTP ``generate``/``infer``; the tenant's priority reaches the model there
too (the request is served). Tenants never share the prefix cache: a prompt goes on from the
cache of its own tenant's (and own ``cache_salt``'s) recent prompts only, counted by the
model's ``tritonforge_generate_prefix_cache_hits_total``."""

from __future__ import annotations

import re
import shutil
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import PIPELINE_REPOSITORY
from tritonforge.generation import CACHE_SALT_PARAMETER, QUEUE_PRIORITY_PARAMETER, TEXT_INPUT
from tritonforge.runtime.front.guard import tenant_salt
from tritonforge.runtime.serving import EmbeddedServer, serving
from tritonforge.runtime.tenants.grpc import TENANT_METADATA
from tritonforge.runtime.tenants.http import TENANT_HEADER
from tritonforge.runtime.tenants.keys import hash_key

pytestmark = pytest.mark.integration

MODEL = "generate"
TENANTS = f"""
[tenants.low]
keys = ["{hash_key("low-key")}"]
priority = 5

[tenants.high]
keys = ["{hash_key("high-key")}"]
priority = 1
"""
LONG_PROMPT = "Count from 1 to 300, separated by commas: 1, 2, 3, 4,"


def _one_slot_repo(root: Path) -> Path:
    """The generate model alone, with 1 running slot (a queue of 4, waits up to 300 s: the
    queue forecast lets the short requests queue behind the long one), its artifacts linked."""
    src = PIPELINE_REPOSITORY / MODEL
    if not (src / "config.pbtxt").exists():
        pytest.skip(reason=f"{src} is not exported (make export)")
    dst = root / MODEL
    shutil.copytree(src, dst, copy_function=lambda s, d: Path(d).symlink_to(Path(s).resolve()))
    text = (src / "config.pbtxt").read_text()
    for key, value in (("max_running", 1), ("max_queue", 4), ("queue_timeout_s", 300)):
        text = re.sub(rf'(key: "{key}" value: {{ string_value: )"\d+"', rf'\1"{value}"', text)
    (dst / "config.pbtxt").unlink()
    (dst / "config.pbtxt").write_text(text)
    return root


def _inputs(prompt: str, max_tokens: int) -> list[grpcclient.InferInput]:
    text = grpcclient.InferInput(TEXT_INPUT, [1], "BYTES")
    text.set_data_from_numpy(np.array([prompt.encode()], dtype=np.object_))
    tokens = grpcclient.InferInput("max_tokens", [1], "INT32")
    tokens.set_data_from_numpy(np.array([max_tokens], dtype=np.int32))
    return [text, tokens]


class Stream:
    """One gRPC ``ModelStreamInfer`` through the front with a tenant key; ``finished`` records
    the final responses' order across streams."""

    def __init__(self, server: EmbeddedServer, key: str, finished: list[str], name: str) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.name, self.finished = name, finished
        self.first, self.done = threading.Event(), threading.Event()
        self.error: str | None = None
        self.client.start_stream(callback=self._on, headers={TENANT_METADATA: key})

    def _on(self, result: Any, error: Any) -> None:
        if error is not None:
            self.error = str(error)
            self.done.set()
            return
        self.first.set()
        final = result.get_response().parameters.get("triton_final_response")
        if final is not None and final.bool_param:
            self.finished.append(self.name)
            self.done.set()

    def send(self, prompt: str, max_tokens: int, parameters: dict[str, Any] | None = None) -> None:
        self.client.async_stream_infer(
            MODEL,
            _inputs(prompt, max_tokens),
            parameters=parameters,
            enable_empty_final_response=True,
        )

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def _hits(server: EmbeddedServer) -> float:
    """The generate model's prefix cache hits on Triton's /metrics."""
    with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
        text = r.read().decode()
    found = re.search(
        rf'tritonforge_generate_prefix_cache_hits_total{{model="{MODEL}"[^}}]*}} (\S+)', text
    )
    assert found is not None, "no prefix cache counter on /metrics"
    return float(found.group(1))


def _generate(server: EmbeddedServer, key: str, prompt: str, salt: str) -> None:
    stream = Stream(server, key, [], key)
    try:
        stream.send(prompt, 2, {CACHE_SALT_PARAMETER: salt})
        assert stream.done.wait(120) and stream.error is None, stream.error
    finally:
        stream.close()


def _tenants_do_not_share_the_prefix_cache(server: EmbeddedServer) -> None:
    """Each step's namespace is new except the last (low's ``s`` again): only it may hit. A
    shared cache would also hit at high's same prompt and salt; a forgeable salt at high's
    copy of low's."""
    prompt = "Name three rivers in Europe and the seas they flow into."
    before = _hits(server)
    _generate(server, "low-key", prompt, "s")
    _generate(server, "high-key", prompt, "s")  # the same prompt and salt, another tenant
    _generate(server, "high-key", prompt, tenant_salt("low", "s"))  # low's namespace, forged
    _generate(server, "low-key", prompt, "t")  # the same tenant, another salt of its own
    _generate(server, "low-key", prompt, "s")  # its own recent prompt: a hit
    deadline = time.monotonic() + 10
    while _hits(server) < before + 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _hits(server) == before + 1


def test_tenant_priority_orders_the_queue_on_grpc_and_a_client_cannot_forge_it(
    tmp_path: Path,
) -> None:
    repo = _one_slot_repo(tmp_path / "repo")
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(TENANTS)
    with serving(repo, tenants_file=tenants) as server:
        finished: list[str] = []
        blocker = Stream(server, "low-key", finished, "blocker")
        low = Stream(server, "low-key", finished, "low")
        high = Stream(server, "high-key", finished, "high")
        try:
            blocker.send(LONG_PROMPT, 160)
            assert blocker.first.wait(120), blocker.error
            low.send("Hi", 4)
            time.sleep(0.5)  # low is queued first
            high.send("Hi", 4)
            time.sleep(0.5)
            assert not blocker.done.is_set(), "the blocker ended before both were queued"
            for stream in (blocker, low, high):
                assert stream.done.wait(180) and stream.error is None, stream.error
            assert finished == ["blocker", "high", "low"], finished
        finally:
            for stream in (blocker, low, high):
                stream.close()

        forged = Stream(server, "low-key", [], "forged")
        try:
            forged.send("Hi", 4, {QUEUE_PRIORITY_PARAMETER: 1})
            assert forged.done.wait(60)
            assert forged.error is not None and QUEUE_PRIORITY_PARAMETER in forged.error
        finally:
            forged.close()
        unary = grpcclient.InferenceServerClient(server.grpc_url)
        with pytest.raises(InferenceServerException, match=QUEUE_PRIORITY_PARAMETER) as refused:
            unary.infer(
                MODEL,
                _inputs("Hi", 2),
                parameters={QUEUE_PRIORITY_PARAMETER: 1},
                headers={TENANT_METADATA: "high-key"},
            )
        assert "INVALID_ARGUMENT" in str(refused.value.status())
        unary.close()

        base = f"http://{server.http_url}/v2/models/{MODEL}"
        headers = {TENANT_HEADER: "high-key"}
        served = requests.post(
            f"{base}/generate_stream", json={TEXT_INPUT: "Hi", "max_tokens": 2},
            headers=headers, timeout=120,
        )  # fmt: skip
        assert served.status_code == 200 and "text_output" in served.text, served.text
        for path, body in (
            ("generate", {TEXT_INPUT: "Hi", "max_tokens": 2, QUEUE_PRIORITY_PARAMETER: 1}),
            ("generate", {TEXT_INPUT: "Hi", "parameters": {QUEUE_PRIORITY_PARAMETER: 1}}),
            ("generate_stream", {TEXT_INPUT: "Hi", QUEUE_PRIORITY_PARAMETER: 1}),
            ("infer", {"inputs": [], "parameters": {QUEUE_PRIORITY_PARAMETER: 1}}),
        ):
            forged_http = requests.post(f"{base}/{path}", json=body, headers=headers, timeout=60)
            assert forged_http.status_code == 400, (path, forged_http.text)
            assert QUEUE_PRIORITY_PARAMETER in forged_http.json()["error"]
        _tenants_do_not_share_the_prefix_cache(server)
