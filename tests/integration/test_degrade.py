"""Degradation, priorities and the client's breaker against the real embedded Triton.

Degradation off (the default spec) answers and refuses as before, every answer from fp32; on
(the spec, or a request's ``fallback``) a burst is partly answered by int8, each answer says
which variant produced it (output, response header) and ``/metrics`` counts the degraded ones.
The breaker is driven against a server that is stopped and started again.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.integration.reliability import MINIMAL, linked_repository, text_inputs
from tritonforge.bls_degrade import DEGRADED_METRIC
from tritonforge.export.tritonconfig import render_pbtxt
from tritonforge.modelconfig import pbtxt_to_dict
from tritonforge.runtime.launcher.settings import ServerSettings
from tritonforge.runtime.serving import EmbeddedServer

pytestmark = pytest.mark.integration

BLS = "embed_bls"
TEXT = "a promotion peak must degrade, not refuse"


def degrading_repository(target: Path, **params: str) -> Path:
    """fp32 + int8 encoders and the BLS, the BLS's own config with ``params`` set."""
    repo = linked_repository(target, ("tokenizer", "encoder_fp32", "encoder_int8", BLS), (BLS,))
    path = repo / BLS / "config.pbtxt"
    config = pbtxt_to_dict(path.read_text())
    for key, value in params.items():
        config["parameters"][key] = {"string_value": value}
    path.write_text(render_pbtxt(config))
    return repo


@pytest.fixture(scope="module")
def degrading_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    """Degradation declared on, with a tiny bound: an execute that finds a second request
    waiting answers from int8."""
    repo = degrading_repository(
        tmp_path_factory.mktemp("degrade") / "repo",
        degrade_enabled="true",
        degrade_max_queued="1",
    )
    with EmbeddedServer(ServerSettings.ephemeral(repo)) as server:
        yield server


def burst(url: str, n: int, parameters: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """``n`` concurrent BLS requests (4 texts each); (variant that answered or "", error)."""
    client = grpcclient.InferenceServerClient(url)
    done = threading.Semaphore(0)
    out: list[tuple[str, str]] = []
    lock = threading.Lock()

    def on_done(result: Any, error: Any) -> None:
        with lock:
            if error is not None:
                out.append(("", str(error)))
            else:
                variants = {v.decode() for v in result.as_numpy("variant").reshape(-1)}
                assert len(variants) == 1, variants  # one request, one variant
                out.append((variants.pop(), ""))
        done.release()

    for _ in range(n):
        client.async_infer(
            BLS, text_inputs([TEXT] * 4), on_done, parameters=parameters, client_timeout=120
        )
    for _ in range(n):
        assert done.acquire(timeout=180), "a request never completed"
    client.close()
    return out


def degraded_count(server: EmbeddedServer) -> float:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    found = re.findall(rf'^{DEGRADED_METRIC}\{{[^}}]*to="int8"[^}}]*\}} (\S+)$', text, re.M)
    return sum(float(v) for v in found)


def http_infer(server: EmbeddedServer, headers: dict[str, str]) -> tuple[dict[str, Any], Any]:
    body = {
        "inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": [TEXT]}],
        "outputs": [
            {"name": n, "parameters": {"binary_data": False}} for n in ("embedding", "variant")
        ],
    }
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/{BLS}/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read()), response.headers


def test_default_answers_say_fp32_and_top_priority_is_accepted(
    pipeline_server: EmbeddedServer,
) -> None:
    payload, headers = http_infer(pipeline_server, {"X-Priority": "1"})
    variant = next(o for o in payload["outputs"] if o["name"] == "variant")
    assert variant["data"] == ["fp32"]
    assert headers["X-Tritonforge-Variant"] == "fp32"
    client = grpcclient.InferenceServerClient(pipeline_server.grpc_url)
    result = client.infer(BLS, text_inputs([TEXT]), priority=1)
    assert result.as_numpy("variant").reshape(-1).tolist() == [b"fp32"]
    # a bad header is the caller's mistake, named
    with pytest.raises(urllib.error.HTTPError) as bad:
        http_infer(pipeline_server, {"X-Fallback": "int8; drop"})
    assert bad.value.code == 400 and "X-Fallback" in bad.value.read().decode()
    with pytest.raises(Exception, match="fallback"):
        client.infer(BLS, text_inputs([TEXT]), parameters={"fallback": "fp16"})


def test_off_by_default_a_burst_is_answered_by_fp32_only(pipeline_server: EmbeddedServer) -> None:
    before = degraded_count(pipeline_server)
    results = burst(pipeline_server.grpc_url, 24)
    answered = [v for v, e in results if not e]
    assert answered and set(answered) == {"fp32"}, results
    assert degraded_count(pipeline_server) == before  # nothing degraded, nothing counted


def test_a_request_can_opt_in_and_a_burst_is_partly_answered_by_int8(
    pipeline_server: EmbeddedServer,
) -> None:
    before = degraded_count(pipeline_server)
    results = burst(pipeline_server.grpc_url, 24, {"fallback": "int8"})
    answered = [v for v, e in results if not e]
    assert "int8" in answered, results
    assert set(answered) <= {"fp32", "int8"}
    assert degraded_count(pipeline_server) - before == answered.count("int8")


def test_declared_on_it_degrades_unless_the_request_forbids_it(
    degrading_server: EmbeddedServer,
) -> None:
    before = degraded_count(degrading_server)
    results = burst(degrading_server.grpc_url, 24)
    answered = [v for v, e in results if not e]
    assert "int8" in answered and not [e for _, e in results if e], results
    assert degraded_count(degrading_server) - before == answered.count("int8")
    forbidden = burst(degrading_server.grpc_url, 24, {"fallback": "none"})
    assert {v for v, _ in forbidden} <= {"fp32", ""}, forbidden
    # the header does the same over HTTP, and a lone request is not degraded
    _, headers = http_infer(degrading_server, {"X-Fallback": "none"})
    assert headers["X-Tritonforge-Variant"] == "fp32"


def test_degraded_answers_stay_close_to_fp32(degrading_server: EmbeddedServer) -> None:
    client = grpcclient.InferenceServerClient(degrading_server.grpc_url)
    fp32 = client.infer(BLS, text_inputs([TEXT]), parameters={"variant": "fp32"})
    int8 = client.infer(BLS, text_inputs([TEXT]), parameters={"variant": "int8"})
    a, b = (r.as_numpy("embedding")[0] for r in (fp32, int8))
    assert float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b))) > 0.97
    assert int8.as_numpy("variant").reshape(-1).tolist() == [b"int8"]


def test_breaker_opens_on_a_stopped_server_and_one_probe_closes_it_on_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tritonforge.client.breaker import CLOSED, OPEN, BreakerPolicy, CircuitBreaker
    from tritonforge.client.errors import CircuitOpenError, ClientError
    from tritonforge.client.sync import EmbeddingClient

    repo = linked_repository(tmp_path / "repo", MINIMAL)
    settings = ServerSettings.ephemeral(repo)
    server = EmbeddedServer(settings).start().wait_ready()
    cooldown_s = 2.0
    try:
        for protocol, url in (("http", server.http_url), ("grpc", server.grpc_url)):
            breaker = CircuitBreaker(url, BreakerPolicy(2, window_s=60.0, cooldown_s=cooldown_s))
            with EmbeddingClient(
                url, protocol, breaker=breaker, timeout_s=10, max_attempts=3, deadline_s=20
            ) as c:
                assert c.embed([TEXT]).shape == (1, 384)
        server.stop()
        clients = {
            p: EmbeddingClient(
                u,
                p,
                breaker=CircuitBreaker(u, BreakerPolicy(2, 60.0, cooldown_s)),
                timeout_s=5,
                max_attempts=5,
                deadline_s=20,
            )
            for p, u in (("http", server.http_url), ("grpc", server.grpc_url))
        }
        for c in clients.values():
            with pytest.raises(ClientError):
                c.embed([TEXT])
            assert c.breaker.state == OPEN
            started = time.monotonic()
            with pytest.raises(CircuitOpenError, match=re.escape(c.settings.address)):
                c.embed([TEXT])
            assert time.monotonic() - started < 1.0  # failed fast, without the network
        server = EmbeddedServer(settings).start().wait_ready()  # same ports
        time.sleep(cooldown_s)
        with caplog.at_level(logging.INFO, logger="tritonforge.client.breaker"):
            for c in clients.values():
                assert c.embed([TEXT]).shape == (1, 384)  # the probe
                assert c.breaker.state == CLOSED
        assert caplog.text.count("half-open") == len(clients)  # one probe each
    finally:
        server.stop()


def test_a_top_priority_request_overtakes_queued_bulk_traffic(
    pipeline_server: EmbeddedServer,
) -> None:
    """24 bulk requests queue up at the BLS, then one at priority 1: it finishes before most
    of the bulk requests that were sent before it (ordering, not timing)."""
    client = grpcclient.InferenceServerClient(pipeline_server.grpc_url)
    order: list[str] = []
    lock = threading.Lock()
    done = threading.Semaphore(0)

    def on_done(name: str) -> Any:
        def record(result: Any, error: Any) -> None:
            with lock:
                order.append(name if error is None else f"{name}: {error}")
            done.release()

        return record

    bulk = text_inputs([TEXT] * 16)
    for i in range(24):
        client.async_infer(BLS, bulk, on_done(f"bulk{i}"), client_timeout=120)
    client.async_infer(BLS, text_inputs([TEXT]), on_done("top"), priority=1, client_timeout=120)
    for _ in range(25):
        assert done.acquire(timeout=180), "a request never completed"
    client.close()
    # on a busy machine a bulk request may wait past the queue timeout: that is its answer too
    assert all(":" not in n or "timeout" in n.lower() for n in order), order
    assert "top" in order, order  # the priority request itself was answered
    # FIFO would put it in the last batch (at most 3 bulk answers after it)
    assert len(order) - 1 - order.index("top") >= 8, order


def test_a_call_the_fp32_encoder_refuses_is_answered_by_int8_when_allowed(
    tmp_path: Path,
) -> None:
    """One fp32 encoder instance whose queue times a request out at once: the second BLS
    instance's call is refused by it. With ``fallback=int8`` that call is answered by int8
    (the overload monitor's bounds are out of reach here); with ``none`` it fails as today."""
    repo = linked_repository(
        tmp_path / "repo",
        ("tokenizer", "encoder_fp32", "encoder_int8", BLS),
        ("encoder_fp32", BLS),
    )
    for model, edit in (
        (
            "encoder_fp32",
            lambda c: (
                c["instance_group"][0].update(count=1),
                c["dynamic_batching"]["default_queue_policy"].update(
                    default_timeout_microseconds="1"
                ),
            ),
        ),
        (
            BLS,
            lambda c: c["parameters"].update(
                stage_timeout_ms={"string_value": "0"},
                degrade_max_queued={"string_value": "1000"},
                degrade_max_queue_delay_ms={"string_value": "1000000"},
            ),
        ),
    ):
        path = repo / model / "config.pbtxt"
        config = pbtxt_to_dict(path.read_text())
        edit(config)
        path.write_text(render_pbtxt(config))
    with EmbeddedServer(ServerSettings.ephemeral(repo)) as server:
        refused = burst(server.grpc_url, 24, {"fallback": "none"})
        errors = [e for _, e in refused if e]
        assert errors and all("timeout" in e.lower() for e in errors), refused
        degraded = burst(server.grpc_url, 24, {"fallback": "int8"})
        assert not [e for _, e in degraded if e], degraded
        assert "int8" in {v for v, _ in degraded}, degraded
        assert degraded_count(server) == sum(1 for v, _ in degraded if v == "int8")
