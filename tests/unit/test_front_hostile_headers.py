"""The front answers hostile headers with a 400 naming the field, never a 500 with a traceback,
and logs repeated refusals once (issue #19 finding 6). A real front on free loopback ports whose
upstream socket does not exist: every refusal here happens before anything is forwarded."""

from __future__ import annotations

import json
import logging
import re
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tritonforge.runtime.front.app import Front
from tritonforge.runtime.launcher.settings import free_port


@pytest.fixture
def front(tmp_path: Path) -> Iterator[Front]:
    f = Front(
        "127.0.0.1",
        free_port(),
        free_port(),
        http_socket=lambda: tmp_path / "absent.sock",
        grpc_target=lambda: f"unix:{tmp_path}/absent-grpc.sock",
        admin_key=None,
        admin_header="x-admin",
        grpc_admin_headers=("x-admin",),
    ).start()
    try:
        yield f
    finally:
        f.stop()


def post(front: Front, headers: dict[str, str], body: bytes = b'{"inputs": []}') -> tuple[int, str]:
    """POST with ``headers`` sent as UTF-8 bytes (urllib would send latin-1)."""
    utf8 = {k: v.encode().decode("latin-1") for k, v in headers.items()}
    request = urllib.request.Request(
        f"http://127.0.0.1:{front.http_port}/v2/models/embed/infer",
        data=body,
        headers={"Content-Type": "application/json", **utf8},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("Inference-Header-Content-Length", "²"),
        ("Inference-Header-Content-Length", "1" * 5000),
        ("X-Model-Version", "²"),
        ("X-Model-Version", "9" * 5000),
    ],
    ids=["length-superscript", "length-5000-digits", "version-superscript", "version-5000"],
)
def test_hostile_header_is_a_400_naming_it(front: Front, header: str, value: str) -> None:
    status, body = post(front, {header: value})
    assert status == 400, body
    message = json.loads(body)["error"]
    assert header in message
    assert len(body) < 300 and (len(value) <= 40 or value[:41] not in message)


def test_refusals_are_logged_once_per_kind_not_once_per_request(
    front: Front, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="tritonforge.runtime.front.app"):
        for _ in range(50):
            assert post(front, {"Inference-Header-Content-Length": "²"})[0] == 400
    lines = [r for r in caplog.records if r.name == "tritonforge.runtime.front.app"]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert not any(r.exc_info for r in lines)
    assert front.errors.pending("http 400") == 49


def test_a_draining_front_answers_503_without_forwarding(front: Front) -> None:
    front.begin_drain()
    status, body = post(front, {})
    assert status == 503 and "shutting down" in json.loads(body)["error"]
    assert front.wait_idle(timeout_s=5)


MALFORMED = {
    "bad request line": b"GET / HTTP/1.1 junk\r\nHost: x\r\n\r\n",
    "header without a colon": b"GET / HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
    "duplicate Content-Length": (
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"
    ),
    "70 KB header": b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n",
    "bad chunk": b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
}


def send_raw(front: Front, raw: bytes) -> bytes:
    """``raw`` over a fresh connection after one good request on it (aiohttp logs a bad first
    request line at debug level only, and a flooder can always send a good one first)."""
    with socket.create_connection(("127.0.0.1", front.http_port), timeout=30) as sock:
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n" + raw)
        seen = b""
        while seen.count(b"HTTP/1.") < 2:
            chunk = sock.recv(65536)
            if not chunk:
                break
            seen += chunk
        return seen


def test_malformed_requests_are_logged_once_per_kind_without_tracebacks(
    front: Front, caplog: pytest.LogCaptureFixture
) -> None:
    """aiohttp's own parser logged a full traceback (``aiohttp.server``, "Error handling
    request") for every malformed request, so anyone could fill the log: they go through the
    front's throttled log, the first of each kind as one line, the rest counted."""
    repeat = 20
    with caplog.at_level(logging.DEBUG):
        for raw in MALFORMED.values():
            for _ in range(repeat):
                assert b" 400 Bad Request\r\n" in send_raw(front, raw)
        front.stop()  # flushes the pending counts
    traced = [r for r in caplog.records if r.exc_info and r.levelno >= logging.INFO]
    assert not traced, [f"{r.name}: {r.getMessage()}" for r in traced[:3]]
    lines = [r.getMessage() for r in caplog.records if r.name == "tritonforge.runtime.front.app"]
    kinds = {line.split(":", 1)[0] for line in lines}
    assert kinds and all(k.startswith("http 400 ") for k in kinds), lines
    assert len(lines) <= 2 * len(kinds) <= 2 * len(MALFORMED), lines  # first + one count
    counted = sum(int(m.group(1)) for m in map(re.compile(r": (\d+) more in").search, lines) if m)
    assert counted + len(kinds) == repeat * len(MALFORMED), lines
