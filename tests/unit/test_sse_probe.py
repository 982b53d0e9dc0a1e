"""The SSE ``generate_stream`` reader shared by the chaos probe and the flood, against a local
HTTP server answering as the front does: a stream of events, or a 503 refusal with Retry-After."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tritonforge.loadtest.reliability.chaos.outcomes import CLEAN, OK
from tritonforge.loadtest.reliability.chaos.probes import read_sse, sse_once
from tritonforge.loadtest.reliability.flood import one_stream


class Front(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        if "/busy/" in self.path:
            body = json.dumps({"error": "generate: queue full; retry"}).encode()
            self.send_response(503)
            self.send_header("Retry-After", "2")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for event in ({"text_output": "a"}, {"text_output": "b", "finish_reason": "length"}):
            self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def front() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Front)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_stream_is_read_to_its_finish_reason(front: str) -> None:
    read = read_sse(front, "generate", {"text_input": "hi"}, timeout_s=10)
    assert (read.status, read.events, read.finished, read.error) == (200, 2, True, "")
    assert sse_once(front, "generate", {"text_input": "hi"}, 10, cancel_after_first=False) == (
        OK,
        "",
    )
    stream = one_stream(front, "generate", {"text_input": "hi"}, 10, 0.0)
    assert stream.status == 200 and stream.finished and not stream.cut


def test_a_refusal_keeps_its_retry_after_and_body(front: str) -> None:
    read = read_sse(front, "busy", {"text_input": "hi"}, timeout_s=10)
    assert (read.status, read.retry_after, read.events) == (503, "2", 0)
    assert "queue full" in read.error
    assert sse_once(front, "busy", {"text_input": "hi"}, 10, cancel_after_first=False) == (
        CLEAN,
        "HTTP 503",
    )
    stream = one_stream(front, "busy", {"text_input": "hi"}, 10, 0.0)
    assert stream.refused and stream.retry_after == "2"


def test_nothing_listening_is_the_reads_exception_not_a_raise() -> None:
    from tritonforge.loadtest.anchors.local_server import free_port

    read = read_sse(f"127.0.0.1:{free_port()}", "generate", {}, timeout_s=5)
    assert isinstance(read.exception, OSError) and read.status == 0 and read.error
