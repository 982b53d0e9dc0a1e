"""An in-process OTLP/HTTP trace receiver on loopback (what an OpenTelemetry collector's
``otlphttp`` receiver does, minus the forwarding), for tests.

Triton 2.51 posts ``ExportTraceServiceRequest`` as OTLP/JSON (``Content-Type: application/json``,
ids in hex); that is all this decodes.
"""

from __future__ import annotations

import gzip
import http.server
import json
import threading
import time
from dataclasses import dataclass
from typing import Any

from tritonforge.closing import Closing


@dataclass(frozen=True)
class Span:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    service: str


def _service(resource: dict[str, Any]) -> str:
    for attr in resource.get("attributes", []):
        if attr.get("key") == "service.name":
            return str(attr.get("value", {}).get("stringValue", ""))
    return ""


def parse_export(body: dict[str, Any]) -> list[Span]:
    """The spans of one OTLP/JSON ``ExportTraceServiceRequest``."""
    spans = []
    for rs in body.get("resourceSpans", []):
        service = _service(rs.get("resource", {}))
        for ss in rs.get("scopeSpans", []):
            for s in ss.get("spans", []):
                spans.append(
                    Span(
                        trace_id=s["traceId"].lower(),
                        span_id=s["spanId"].lower(),
                        parent_span_id=s.get("parentSpanId", "").lower(),
                        name=s["name"],
                        service=service,
                    )
                )
    return spans


class OtlpReceiver(Closing):
    """``with OtlpReceiver() as r:`` listens on 127.0.0.1 (free port); ``r.endpoint`` is
    ``host:port``; ``r.spans`` collects what was posted to ``/v1/traces``."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.rejected: list[str] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces" or "json" not in self.headers.get("Content-Type", ""):
                    receiver.rejected.append(f"{self.path} {self.headers.get('Content-Type')}")
                    self.send_response(415)
                    self.end_headers()
                    return
                try:
                    spans = parse_export(json.loads(body))
                except (ValueError, KeyError, TypeError, AttributeError) as e:
                    receiver.rejected.append(f"unparsable export ({type(e).__name__}: {e})")
                    self.send_response(400)
                    self.end_headers()
                    return
                with receiver._lock:
                    receiver.spans.extend(spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host}:{port}"

    def trace(self, trace_id: str, until: set[str], timeout_s: float = 30.0) -> list[Span]:
        """The spans of ``trace_id`` once every name in ``until`` arrived (or at the timeout)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                spans = [s for s in self.spans if s.trace_id == trace_id]
            if until <= {s.name for s in spans} or time.monotonic() > deadline:
                return spans
            time.sleep(0.1)

    def summary(self) -> str:
        """Every trace received so far (id -> span names) and the rejected posts, for a failing
        assertion's message: an empty trace then says whether Triton exported nothing at all or
        exported the request under another trace id."""
        with self._lock:
            traces: dict[str, list[str]] = {}
            for s in self.spans:
                traces.setdefault(s.trace_id, []).append(f"{s.name}<-{s.parent_span_id or '-'}")
        return f"{len(traces)} trace(s) received: {traces}; rejected posts: {self.rejected}"

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
