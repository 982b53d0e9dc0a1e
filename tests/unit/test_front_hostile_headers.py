"""The front answers hostile headers with a 400 naming the field, never a 500 with a traceback,
and logs repeated refusals once (issue #19 finding 6). A real front on free loopback ports whose
upstream socket does not exist: every refusal here happens before anything is forwarded."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tritonforge.runtime.front import Front
from tritonforge.runtime.settings import free_port


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
    with caplog.at_level(logging.WARNING, logger="tritonforge.runtime.front"):
        for _ in range(50):
            assert post(front, {"Inference-Header-Content-Length": "²"})[0] == 400
    lines = [r for r in caplog.records if r.name == "tritonforge.runtime.front"]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert not any(r.exc_info for r in lines)
    assert front.errors.pending("http 400") == 49


def test_a_draining_front_answers_503_without_forwarding(front: Front) -> None:
    front.begin_drain()
    status, body = post(front, {})
    assert status == 503 and "shutting down" in json.loads(body)["error"]
    assert front.wait_idle(timeout_s=5)
