"""Issue #19 on the real embedded Triton, through the real front: streams are isolated from short
requests and bounded (finding 2b), a cancelled stream frees its decoding slot at once (finding 4),
SIGTERM under load is quick and clean (finding 5), and version pins / ``top_k`` are honoured or
refused on every route (finding 7)."""

from __future__ import annotations

import contextlib
import http.client
import json
import queue
import re
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.reliability import MINIMAL, launch, linked_repository, text_inputs
from tritonforge.client.generate import GenerateClient, grpc_inputs
from tritonforge.runtime.front.settings import FrontLimits
from tritonforge.runtime.launcher.settings import ServerSettings
from tritonforge.runtime.serving import EmbeddedServer

pytestmark = pytest.mark.integration
GENERATE = ("generate",)
LONG = "Write a very long story about a dragon, a knight and a castle by the sea."
# The promise is 1 s; the bound is generous for a loaded 2-core machine. Before the fix a
# cancelled stream decoded to its end: max_tokens=400 is tens of seconds here.
FREED_WITHIN_S = 4.0
MAX_TOKENS = 400
# 21.6 s measured at load 14 (exit 0, nothing left): under 30 s it still catches a shutdown
# held by Triton's 30 s exit timeout (the old 33-41 s)
SIGTERM_BOUND_S = 28.0


def inflight(server: EmbeddedServer) -> tuple[int, int]:
    """``(running, queued)`` sequences of the generate model, from its gauges on /metrics."""
    with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
        text = r.read().decode()
    values = {}
    for what in ("running", "queued"):  # summed over the decoder variants (one model each)
        found = re.findall(rf"^tritonforge_generate_{what}_sequences\{{[^}}]*\}} (\S+)", text, re.M)
        values[what] = int(sum(float(v) for v in found)) if found else -1
    return values["running"], values["queued"]


def wait_inflight(server: EmbeddedServer, at_least: int, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while sum(inflight(server)) < at_least:
        assert time.monotonic() < deadline, f"streams never started: {inflight(server)}"
        time.sleep(0.1)


def seconds_until_idle(server: EmbeddedServer, timeout_s: float = 60) -> float:
    started = time.monotonic()
    while inflight(server) != (0, 0):
        assert time.monotonic() - started < timeout_s, f"slots still held: {inflight(server)}"
        time.sleep(0.05)
    return time.monotonic() - started


@pytest.fixture(scope="module")
def generate_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    repo = linked_repository(tmp_path_factory.mktemp("gen") / "repo", (*MINIMAL, *GENERATE))
    limits = FrontLimits(max_upstream_connections=8, max_open_streams=12)
    with EmbeddedServer(ServerSettings.ephemeral(repo, front_limits=limits)) as server:
        yield server


def grpc_stream(
    url: str, prompt: str, timeout_s: float | None = None
) -> tuple[object, queue.Queue]:
    client = grpcclient.InferenceServerClient(url)
    responses: queue.Queue[tuple[object, object]] = queue.Queue()
    kwargs = {} if timeout_s is None else {"stream_timeout": timeout_s}
    client.start_stream(
        callback=lambda result, error: responses.put((result, error)),
        **kwargs,  # type: ignore[arg-type]
    )
    with contextlib.suppress(InferenceServerException):  # refused at once: see the callback
        client.async_stream_infer(
            "generate",
            grpc_inputs(grpcclient.InferInput, prompt, []),
            parameters={"max_tokens": MAX_TOKENS},
            enable_empty_final_response=True,
        )
    return client, responses


def front_metrics(server: EmbeddedServer) -> dict[str, float]:
    """The front's own gauges (``tritonforge_front_*``) on the metrics port."""
    with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
        text = r.read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("tritonforge_front_")
    }


def triton_http_connections(server: EmbeddedServer) -> int:
    """Connections Triton has accepted on its private HTTP socket (from /proc/net/unix: an
    accepted socket carries the listener's path; state 03 = connected)."""
    path = str(server.http_socket)
    rows = Path("/proc/net/unix").read_text().splitlines()[1:]
    return sum(1 for r in rows if r.split()[-1] == path and r.split()[5] == "03")


def sse_socket(server: EmbeddedServer, prompt: str) -> socket.socket:
    """A raw HTTP generate_stream request whose first event has arrived (close() = disconnect)."""
    host, port = server.http_url.split(":")
    body = json.dumps({"text_input": prompt, "parameters": {"max_tokens": MAX_TOKENS}}).encode()
    sock = socket.create_connection((host, int(port)), timeout=60)
    sock.sendall(
        b"POST /v2/models/generate/generate_stream HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    seen = b""
    while b"data:" not in seen:
        chunk = sock.recv(4096)
        assert chunk, seen
        seen += chunk
    assert b" 200 " in seen.split(b"\r\n")[0], seen[:300]
    return sock


def test_cancelled_grpc_streams_free_their_slots_at_once(generate_server: EmbeddedServer) -> None:
    """Finding 4: 40 cancelled gRPC streams held their slots 5-20 s."""
    server = generate_server
    streams = [grpc_stream(server.grpc_url, f"{LONG} ({i})") for i in range(6)]
    for _, responses in streams:
        assert responses.get(timeout=90)[1] is None
    wait_inflight(server, 6)
    for client, _ in streams:
        client.stop_stream(cancel_requests=True)  # type: ignore[attr-defined]
    freed_s = seconds_until_idle(server)
    print(f"6 gRPC streams cancelled: slots free after {freed_s:.2f} s")
    assert freed_s < FREED_WITHIN_S


def test_grpc_stream_deadline_frees_the_slot_at_once(generate_server: EmbeddedServer) -> None:
    server = generate_server
    client, responses = grpc_stream(server.grpc_url, LONG, timeout_s=4.0)
    assert responses.get(timeout=90)[1] is None
    started = time.monotonic()
    while True:  # until the client's deadline ends the stream
        _, error = responses.get(timeout=60)
        if error is not None:
            break
    freed_s = seconds_until_idle(server)
    print(f"deadline at +{time.monotonic() - started:.1f} s; slot free {freed_s:.2f} s later")
    assert freed_s < FREED_WITHIN_S
    client.stop_stream()  # type: ignore[attr-defined]


def test_sse_disconnects_free_their_slots_at_once(generate_server: EmbeddedServer) -> None:
    server = generate_server
    socks = [sse_socket(server, f"{LONG} ({i})") for i in range(4)]
    wait_inflight(server, 4)
    assert front_metrics(server)['tritonforge_front_open_streams{model="generate"}'] == 4
    for sock in socks:
        sock.close()
    freed_s = seconds_until_idle(server)
    print(f"4 SSE clients gone: slots free after {freed_s:.2f} s")
    assert freed_s < FREED_WITHIN_S
    deadline = time.monotonic() + FREED_WITHIN_S
    while front_metrics(server)['tritonforge_front_open_streams{model="generate"}'] != 0:
        assert time.monotonic() < deadline, front_metrics(server)
        time.sleep(0.05)


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: Path) -> None:
        super().__init__("triton", timeout=120)
        self.path = str(path)

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(120)
        self.sock.connect(self.path)


def generate_stream(
    server: EmbeddedServer, model: str, body: dict[str, Any], direct: bool
) -> tuple[int, str, bytes]:
    """``(status, content type, body)`` of a ``generate_stream`` request through the front, or
    ``direct`` to Triton's own HTTP endpoint on its private socket."""
    data = json.dumps(body).encode()
    path = f"/v2/models/{model}/generate_stream"
    if direct:
        conn = _UnixHTTPConnection(server.http_socket)
        try:
            conn.request("POST", path, data, {"Content-Type": "application/json"})
            r = conn.getresponse()
            return r.status, r.getheader("Content-Type") or "", r.read()
        finally:
            conn.close()
    request = urllib.request.Request(f"http://{server.http_url}{path}", data=data)
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read()


def test_the_fronts_sse_is_tritons_generate_stream_byte_for_byte(
    generate_server: EmbeddedServer,
) -> None:
    """The front serves generate_stream itself over gRPC, in Triton's own wire format: the
    same status, content type and events (greedy, so both runs decode the same tokens) as
    Triton's HTTP endpoint, for streams, a request the model refuses in-stream, an unknown
    model and a request Triton cannot map."""
    server = generate_server
    greedy = {"max_tokens": 12, "temperature": 0.0}
    for model, body, exact in (
        ("generate", {"text_input": "Hello, how are you?", "parameters": greedy}, True),
        ("generate", {"text_input": "", "parameters": greedy}, True),
        ("generate", {"text_input": "Hi", "parameters": {"max_tokens": -3}}, True),
        ("no_such_model", {"text_input": "Hi"}, False),
        ("generate", {"text_input": "Hi", "parameters": {"not_an_input": 0.5, **greedy}}, True),
        ("generate", {"text_input": "Hi", "parameters": {"not_an_input": [1]}}, False),
    ):
        direct = generate_stream(server, model, body, direct=True)
        front = generate_stream(server, model, body, direct=False)
        print(f"{model} {body}:\n  triton {direct}\n  front  {front}")
        assert front[:2] == direct[:2], (front, direct)
        if exact:
            assert front == direct
    # Triton answers 500 ("attempt to access JSON non-string as string"); the front never
    # answers 500 to input (A4): 400 naming the key
    front = generate_stream(server, "generate", {"text_input": 5}, direct=False)
    assert front[0] == 400 and b"text_input" in front[2], front
    assert front_metrics(server)['tritonforge_front_open_streams{model="generate"}'] == 0


def test_open_streams_do_not_starve_short_requests_and_are_bounded(
    generate_server: EmbeddedServer,
) -> None:
    """Finding 2b: 64 open SSE streams took every upstream connection, so `embed` waited 9.7 s or
    got 503 and /v2/health/ready went unanswered. Here max_open_streams=12 streams are open over
    a front with only 8 short-request connections: short requests still answer, and the 13th
    stream is refused with a clear 503 / UNAVAILABLE."""
    server = generate_server
    limit = server.settings.front_limits.max_open_streams
    socks = [sse_socket(server, f"{LONG} ({i})") for i in range(limit - 2)]
    grpc_clients = [grpc_stream(server.grpc_url, f"{LONG} (g{i})") for i in range(2)]
    try:
        for _, responses in grpc_clients:
            assert responses.get(timeout=90)[1] is None
        http = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        for _ in range(3):
            started = time.monotonic()
            assert http.is_server_ready()
            tensor = httpclient.InferInput("text", [1, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[b"still served"]], dtype=np.object_))
            assert http.infer("embed", [tensor]).as_numpy("embedding").shape[0] == 1
            took_s = time.monotonic() - started
            print(f"embed + ready with {limit} streams open: {took_s:.2f} s")
            assert took_s < 8.0  # before: 9.7 s or 503 after queue_timeout_s=10
        # The SSE streams go over gRPC: the front counts them, and Triton's HTTP socket holds
        # no more connections than the short-request pool (before: one per SSE stream too)
        held = triton_http_connections(server)
        print(f"Triton HTTP connections with {limit} streams open: {held}")
        assert held <= server.settings.front_limits.max_upstream_connections < limit - 2
        front = front_metrics(server)
        assert front['tritonforge_front_open_streams{model="generate"}'] == limit, front
        body = json.dumps({"text_input": "x", "parameters": {"max_tokens": 2}}).encode()
        request = urllib.request.Request(
            f"http://{server.http_url}/v2/models/generate/generate_stream", data=body
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 503
        assert "max_open_streams" in refused.value.read().decode()
        client, responses = grpc_stream(server.grpc_url, "x")
        _, error = responses.get(timeout=30)
        assert isinstance(error, InferenceServerException), error
        assert "UNAVAILABLE" in str(error.status()) and "max_open_streams" in str(error)
        client.stop_stream()  # type: ignore[attr-defined]
    finally:
        for sock in socks:
            sock.close()
        for client, _ in grpc_clients:
            client.stop_stream(cancel_requests=True)  # type: ignore[attr-defined]
    seconds_until_idle(server)


@pytest.fixture(scope="module")
def classify_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    from tests.conftest import PIPELINE_REPOSITORY

    models = [
        p.name
        for p in PIPELINE_REPOSITORY.iterdir()
        if p.is_dir() and (p.name.startswith("classify") or p.name in MINIMAL)
    ]
    if "classify_bls" not in models:
        pytest.skip(reason="the classify pipeline is not exported (make export)")
    repo = linked_repository(tmp_path_factory.mktemp("cls") / "repo", tuple(models))
    with EmbeddedServer(ServerSettings.ephemeral(repo)) as server:
        yield server


def http_infer(
    server: EmbeddedServer, model: str, headers: dict[str, str], parameters: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    body = json.dumps(
        {
            "inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": ["great"]}],
            "parameters": parameters,
        }
    ).encode()
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/{model}/infer", data=body, headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        raw = e.read()
        assert len(raw) < 400, raw[:500]
        return e.code, json.loads(raw)


@pytest.mark.parametrize("model", ["classify", "embed"])
def test_a_pin_on_a_model_that_cannot_pin_is_a_400_saying_where_pinning_works(
    classify_server: EmbeddedServer, model: str
) -> None:
    """Finding 7: the classify ensemble answered 200 to X-Model-Version: 99."""
    server = classify_server
    for headers, params in (({"X-Model-Version": "99"}, {}), ({}, {"version": 1})):
        status, body = http_infer(server, model, headers, params)
        assert status == 400, body
        assert "pinning works on: classify_bls" in str(body["error"]), body
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as info:
        client.infer(model, text_inputs(["great"]), parameters={"version": 1})
    assert "INVALID_ARGUMENT" in str(info.value.status()), info.value
    assert "classify_bls" in str(info.value.message())


def test_the_bls_honours_a_pin_and_refuses_a_10kb_one_briefly(
    classify_server: EmbeddedServer,
) -> None:
    server = classify_server
    status, body = http_infer(server, "classify_bls", {"X-Model-Version": "1"}, {})
    assert status == 200, body
    versions = {o["name"]: o["data"] for o in body["outputs"]}["model_version"]
    assert versions == [1]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    for name in ("version", "top_k"):
        with pytest.raises(InferenceServerException) as info:
            client.infer("classify_bls", text_inputs(["great"]), parameters={name: "9" * 10240})
        assert "INVALID_ARGUMENT" in str(info.value.status()), info.value  # not RESOURCE_EXHAUSTED
        assert len(str(info.value.message())) < 300
        status, body = http_infer(server, "classify_bls", {}, {name: "9" * 10240})
        assert status == 400 and name in str(body["error"])


@pytest.mark.parametrize("model", ["classify", "classify_bls"])
def test_top_k_is_honoured_and_out_of_range_is_400_on_every_route(
    classify_server: EmbeddedServer, model: str
) -> None:
    server = classify_server
    status, body = http_infer(server, model, {}, {"top_k": 2})
    assert status == 200, body
    top = {o["name"]: o for o in body["outputs"]}["top_labels"]
    assert top["shape"] == [1, 2], top
    client = grpcclient.InferenceServerClient(server.grpc_url)
    for bad in (0, 99, -1):
        status, body = http_infer(server, model, {}, {"top_k": bad})
        assert status == 400 and "top_k" in str(body["error"]), (bad, body)
        with pytest.raises(InferenceServerException) as info:
            client.infer(model, text_inputs(["great"]), parameters={"top_k": bad})
        assert "INVALID_ARGUMENT" in str(info.value.status()), (bad, info.value)


def family(pid: int) -> list[int]:
    try:
        root = psutil.Process(pid)
        return [root.pid, *(c.pid for c in root.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def test_sigterm_under_16_clients_exits_0_quickly_and_drains_with_unavailable(
    tmp_path: Path,
) -> None:
    """Finding 5: SIGTERM under 16 clients took 33-41 s, tritonserver exited 1 (the launcher 0),
    and gRPC clients got NOT_FOUND "has no available versions" during the drain."""
    repo = linked_repository(tmp_path / "repo", (*MINIMAL, *GENERATE))
    server = launch(repo, "--canary-interval-s", "2")
    outcomes: list[str] = []
    stop = threading.Event()
    try:
        server.health_url(timeout_s=180)
        grpc_url = f"127.0.0.1:{server.grpc_port}"
        http_url = f"127.0.0.1:{server.http_port}"

        def embed_grpc() -> None:
            client = grpcclient.InferenceServerClient(grpc_url)
            while not stop.is_set():
                try:
                    client.infer("embed", text_inputs(["drain"]), client_timeout=30)
                    outcomes.append("ok")
                except InferenceServerException as e:
                    outcomes.append(f"{e.status()}: {e.message()}")

        def embed_http() -> None:
            client = httpclient.InferenceServerClient(http_url, network_timeout=30)
            tensor = httpclient.InferInput("text", [1, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[b"drain"]], dtype=np.object_))
            while not stop.is_set():
                try:
                    client.infer("embed", [tensor])
                    outcomes.append("ok")
                except InferenceServerException as e:
                    outcomes.append(f"{e.status()}: {e.message()}")
                except Exception as e:  # the port closed after the drain
                    outcomes.append(f"closed: {type(e).__name__}")
                    time.sleep(0.1)

        def generate(protocol: str) -> None:
            client = GenerateClient(
                grpc_url if protocol == "grpc" else http_url, protocol=protocol, timeout_s=30
            )
            while not stop.is_set():
                try:
                    for chunk in client.stream(LONG, max_tokens=MAX_TOKENS):
                        if chunk.finish_reason:
                            outcomes.append("ok")
                except Exception as e:
                    outcomes.append(f"stream: {type(e).__name__}: {e}")
                    time.sleep(0.1)

        workers = [
            *(threading.Thread(target=embed_grpc) for _ in range(6)),
            *(threading.Thread(target=embed_http) for _ in range(6)),
            *(threading.Thread(target=generate, args=("grpc",)) for _ in range(2)),
            *(threading.Thread(target=generate, args=("http",)) for _ in range(2)),
        ]
        for w in workers:
            w.start()
        time.sleep(4)
        members = family(server.proc.pid)
        sent_at = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(timeout=60)
        took_s = time.monotonic() - sent_at
        stop.set()
        for w in workers:
            w.join(timeout=60)
        print(f"SIGTERM under 16 clients: exit {code} after {took_s:.1f} s")
        errors = sorted({o[:120] for o in outcomes if o != "ok"})
        print("client outcomes:", outcomes.count("ok"), "ok;", errors)
        assert code == 0, server.output[-3000:]
        # The promise is 10 s (measured 8.2 s at load 7-10); the bound leaves room for a
        # loaded CI machine and still catches the old 33-41 s (Triton's 30 s exit timeout).
        assert took_s <= SIGTERM_BOUND_S, (took_s, server.output[-3000:])
        assert not any("NOT_FOUND" in o or "no available versions" in o for o in outcomes)
        time.sleep(0.5)
        alive = [p for p in members if psutil.pid_exists(p) and p != server.proc.pid]
        alive = [p for p in alive if psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        assert alive == [], alive
        assert "Traceback" not in server.output, server.output[-3000:]
    finally:
        stop.set()
        if server.proc.poll() is None:
            server.proc.kill()


# Before the fix 8 of 150 leaked at load 8 (P(none of 100) < 1 %); at load 22 none of 100 did:
# the cancel must reach Triton while the final response is still being written.
CANARIES = 100


def test_stream_canaries_leave_no_model_live_at_shutdown(tmp_path: Path) -> None:
    """Finding 5's cause: the supervisor's `generate` canary cancelled its gRPC stream right
    after the final response; Triton 2.51 then leaks the stream's state now and then, the state
    holds the model, and tritonserver waited out its exit timeout at shutdown and exited 1
    (measured: 150 such canaries, 8 states never released, exit 1 after 31.6 s). Now a canary
    that got its answer ends its stream gracefully; tritonserver must exit 0."""
    from tritonforge.repository import load_model_config
    from tritonforge.runtime.supervisor.canaries import OK, canary_round

    repo = linked_repository(tmp_path / "repo", GENERATE)
    configs = {"generate": load_model_config(repo, "generate")}
    # a held model costs the exit timeout and exit 1: a short one keeps the failure quick
    server = EmbeddedServer(ServerSettings.ephemeral(repo, exit_timeout_s=10))
    with server:
        for _ in range(CANARIES):
            assert canary_round(server.direct_grpc_url, configs, 30) == {"generate": OK}
        code = server.stop()
        log = server.log_text()
    assert code == 0, [line for line in log.splitlines() if "live models" in line][-3:]
