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


def sse_once(
    http_url: str, model: str, body: dict[str, Any], timeout_s: float, cancel_after_first: bool
) -> tuple[str, str]:
    """One SSE ``generate_stream`` request read to its end (or dropped after the first event);
    (kind, error)."""
    host, port = http_url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
    try:
        conn.request(
            "POST", f"/v2/models/{model}/generate_stream", json.dumps(body),
            {"Content-Type": "application/json"},
        )  # fmt: skip
        resp = conn.getresponse()
        if resp.status != 200:
            resp.read()
            return CLEAN, f"HTTP {resp.status}"
        events = 0
        errored = ""
        for line in resp:
            if line.startswith(b"data: "):
                events += 1
                if b'"error"' in line:
                    errored = line[6:200].decode("utf-8", "replace")
                if cancel_after_first:
                    return OK, ""
        if errored:
            return CLEAN, errored
        return (OK, "") if events else (LOST, "stream ended without an event")
    except TimeoutError:
        return HUNG, f"no answer within {timeout_s:g} s"
    except (OSError, http.client.HTTPException) as e:
        return outcome_kind(f"{type(e).__name__} {e}"), f"{type(e).__name__}: {e}"[:300]
    finally:
        conn.close()


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
