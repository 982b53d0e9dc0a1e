"""The chaos run's requests: one gRPC stream, one SSE stream, one malformed HTTP request, and
the public models to send them to."""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import logging
import os
import queue
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tritonforge.generation import FINISH_REASON
from tritonforge.loadtest.reliability.chaos.outcomes import CLEAN, HUNG, LOST, OK, outcome_kind
from tritonforge.modelconfig import ModelConfig
from tritonforge.pipelines import from_repository
from tritonforge.repository import CANARY_KEY, load_model_config
from tritonforge.runtime.supervisor.canaries import STREAM_END_S, end_stream, stop_stream

log = logging.getLogger(__name__)


def text_tensor(module: Any, name: str, text: str | bytes, batched: bool) -> Any:
    data = text.encode() if isinstance(text, str) else text
    value = np.array([[data]] if batched else [data], dtype=np.object_)
    tensor = module.InferInput(name, list(value.shape), "BYTES")
    tensor.set_data_from_numpy(value)
    return tensor


def stream_once(
    url: str, model: str, inputs: list[Any], max_tokens: int, timeout_s: float,
    cancel_after_first: bool = False,
) -> tuple[str, str]:  # fmt: skip
    """One gRPC stream request; (kind, error). Cancelled after the first response when asked
    (then "ok" once that response came)."""
    import tritonclient.grpc as grpcclient

    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    answered = False
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        client.async_stream_infer(
            model, inputs, parameters={"max_tokens": max_tokens}, enable_empty_final_response=True
        )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                result, error = responses.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                return HUNG, f"no final response within {timeout_s:g} s"
            if error is not None:
                text = f"{error.status() or ''} {error}"
                return outcome_kind(text), text[:300]
            if cancel_after_first:
                return OK, ""
            final = result.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                answered = True  # ended gracefully below: a cancel now can leak Triton's state
                return OK, ""
    except Exception as e:  # the stream itself broke
        # "The stream is no longer in valid state, the error detail is reported through provided
        # callback": the server refused the stream (e.g. the front's max_open_streams); its
        # answer is the callback's error
        with contextlib.suppress(queue.Empty):
            _, error = responses.get(timeout=2.0)
            if error is not None:
                text = f"{error.status() or ''} {error}"
                return outcome_kind(text), text[:300]
        return outcome_kind(str(e)), f"{type(e).__name__}: {e}"[:300]
    finally:
        with contextlib.suppress(Exception):
            if answered:
                end_stream(client, STREAM_END_S)
            else:
                stop_stream(client)
        client.close()


@dataclass
class SseRead:
    """One SSE ``generate_stream`` read: the answer's ``status`` and ``Retry-After``, seconds from
    the caller's start to the response headers (``headers_s``) and to the end (``end_s``), the
    ``data:`` events counted, whether one carried a finish reason, the first error (an error
    event, a refusal's body that is no event stream, or ``exception``'s text)."""

    status: int = 0
    retry_after: str | None = None
    headers_s: float = 0.0
    end_s: float = 0.0
    events: int = 0
    finished: bool = False
    error: str = ""
    exception: OSError | http.client.HTTPException | None = None


def _event(line: bytes) -> dict[str, Any]:
    try:
        event = json.loads(line[6:])
    except ValueError:
        return {"error": f"malformed event: {line[6:200].decode('utf-8', 'replace')}"}
    return event if isinstance(event, dict) else {"error": f"not an object: {event!r}"[:200]}


def read_sse(
    http_url: str,
    model: str,
    body: dict[str, Any],
    timeout_s: float,
    t0: float | None = None,
    stop_after_first: bool = False,
) -> SseRead:
    """POST ``body`` to ``model``'s ``generate_stream`` at ``http_url`` (``host:port``) and read the
    stream to its end (or drop it after the first event); times from ``t0`` (monotonic; default
    now). Never raises on a network failure: it is the read's ``exception``."""
    start = time.monotonic() if t0 is None else t0
    read = SseRead()
    host, port = http_url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
    try:
        conn.request(
            "POST", f"/v2/models/{model}/generate_stream", json.dumps(body),
            {"Content-Type": "application/json"},
        )  # fmt: skip
        resp = conn.getresponse()
        read.status, read.retry_after = resp.status, resp.getheader("Retry-After")
        read.headers_s = time.monotonic() - start
        if resp.status != 200 and not resp.getheader("Content-Type", "").startswith(
            "text/event-stream"
        ):
            read.error = resp.read()[:200].decode("utf-8", "replace") or f"HTTP {resp.status}"
        for line in resp if not read.error else ():
            if not line.startswith(b"data: "):
                continue
            read.events += 1
            event = _event(line)
            if "error" in event:
                read.error = read.error or str(event["error"])[:200]
            elif event.get(FINISH_REASON):
                read.finished = True
            if stop_after_first:
                break
    except (OSError, http.client.HTTPException) as e:
        read.exception, read.error = e, f"{type(e).__name__}: {e}"[:300]
    finally:
        conn.close()
    read.end_s = time.monotonic() - start
    return read


def sse_once(
    http_url: str, model: str, body: dict[str, Any], timeout_s: float, cancel_after_first: bool
) -> tuple[str, str]:
    """One SSE ``generate_stream`` request read to its end (or dropped after the first event);
    (kind, error)."""
    read = read_sse(http_url, model, body, timeout_s, stop_after_first=cancel_after_first)
    if isinstance(read.exception, TimeoutError):
        return HUNG, f"no answer within {timeout_s:g} s"
    if read.exception is not None:
        e = read.exception
        return outcome_kind(f"{type(e).__name__} {e}"), read.error
    if read.status != 200:
        return CLEAN, f"HTTP {read.status}"
    if read.error:
        return CLEAN, read.error
    return (OK, "") if read.events else (LOST, "stream ended without an event")


MALFORMED = (
    b"POST /v2/models/x/infer HTTP/1.1\r\nHost: a\r\nContent-Length: abc\r\n\r\n",
    b"GET /v2/health/ready HTTP/1.1\r\nHost a\r\nno-colon-here\r\n\r\n",
    b"GET /v2/health/ready HTTP/1.1\r\nHost: a\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n",
    b"POST /v2/models/x/infer HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"GET /v2/health/ready HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(64),
)


def malformed_once(host: str, port: int, payload: bytes, timeout_s: float) -> tuple[str, str]:
    """Send one malformed request; a status line back (or the connection closed by the front at
    once, which is how it refuses garbage) is clean, silence until the timeout is hung."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(payload)
            data = sock.recv(64)
    except TimeoutError:
        return HUNG, "no answer"
    except OSError as e:
        return CLEAN, f"closed: {e}"
    if data.startswith(b"HTTP/1.") or not data:
        return CLEAN, data[:40].decode("latin-1")
    return CLEAN, "answered"


@dataclass(frozen=True)
class Target:
    pipeline: str
    model: str
    config: ModelConfig
    input: str
    inputs: tuple[str, ...] = ()
    """Every required text input (a pair task has two); ``input`` is the first."""

    def tensors(self, module: Any, text: str) -> list[Any]:
        """One tensor per required text input, each holding ``text`` (or the item the config
        declares for its canaries, ``CANARY_KEY``: an image model's input is not text)."""
        batched = self.config.batched
        declared = self.config.parameters.get(CANARY_KEY)
        data = base64.b64decode(declared) if declared else text
        return [text_tensor(module, name, data, batched) for name in self.inputs or (self.input,)]

    @property
    def decoupled(self) -> bool:
        return bool(self.config.raw.get("model_transaction_policy", {}).get("decoupled"))


def targets(repository: Path, models: Iterable[str]) -> list[Target]:
    """Every public model (what the supervisor canaries) with its pipeline and text input."""
    owner = {m: p.name for p in from_repository(repository).values() for m in p.public_models}
    out = []
    for model in models:
        config = load_model_config(repository, model)
        texts = tuple(s.name for s in config.inputs if not s.optional and s.wire_dtype == "BYTES")
        if texts:
            out.append(Target(owner.get(model, model), model, config, texts[0], texts))
    return out
