"""Canary inferences: one short request through a model, and what its failure means (busy or
broken). The supervisor's readiness checks (:mod:`runtime.supervisor.supervisor`) are rounds of these."""

from __future__ import annotations

import base64
import queue
import re
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from tritonforge.modelconfig import ModelConfig
from tritonforge.repository import CANARY_KEY

CANARY_TEXT = b"tritonforge canary"
OK = "ok"
OVERLOADED = "overloaded"
FAILED = "failed"
RECOVERING = "recovering"
# What Triton, the front and our models answer when they are busy, not broken.
_OVERLOAD_CODES = ("UNAVAILABLE", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED")
_OVERLOAD_WORDS = (
    "queue",
    "deadline",
    "timed out",
    "timeout",
    "too many",
    "busy",
    "overload",
    "no answer from tritonserver",
    "try again",
)
# ... but these UNAVAILABLE answers mean the model is gone, not busy.
_GONE_WORDS = ("unknown model", "no available versions", "not found", "is not ready")
_UNHEALTHY_STUB = re.compile(r"Stub process '([^']+)' is not healthy")


def canary_inputs(config: ModelConfig) -> dict[str, np.ndarray]:
    """One-row sample for every required input: a short text for BYTES (or the config's
    declared item, :data:`CANARY_KEY`), ones otherwise."""
    inputs: dict[str, np.ndarray] = {}
    declared = config.parameters.get(CANARY_KEY)
    item = base64.b64decode(declared) if declared else CANARY_TEXT
    for spec in config.inputs:
        if spec.optional:
            continue
        shape = tuple(1 if d < 0 else d for d in spec.full_shape(config.batched))
        if np.dtype(spec.numpy_dtype).kind == "O":
            inputs[spec.name] = np.full(shape, item, dtype=np.object_)
        else:
            inputs[spec.name] = np.ones(shape, dtype=spec.numpy_dtype)
    return inputs


def classify_failure(error: str) -> str:
    """:data:`OVERLOADED` when a canary's error says the server is busy (queue full,
    ``UNAVAILABLE``, ``RESOURCE_EXHAUSTED``, a deadline), else :data:`FAILED`."""
    lowered = error.lower()
    if _UNHEALTHY_STUB.search(error) or any(w in lowered for w in _GONE_WORDS):
        return FAILED
    if any(code in error for code in _OVERLOAD_CODES) or any(w in lowered for w in _OVERLOAD_WORDS):
        return OVERLOADED
    return FAILED


def unhealthy_stubs(error: str) -> list[str]:
    """Model instances a canary's error reports unhealthy (``Stub process '<x>' is not
    healthy``)."""
    return sorted(set(_UNHEALTHY_STUB.findall(error)))


def stream_canary(url: str, model: str, inputs: list[Any], timeout_s: float) -> None:
    """One request to a decoupled model over a gRPC stream (a unary infer is refused), asking
    for one token (``max_tokens``: the generate convention); raises unless it ends with a final
    response within ``timeout_s`` (TimeoutError: no answer in time).

    A stream that got its final response is ended gracefully (:func:`end_stream`), never
    cancelled: Triton 2.51's gRPC handler can leak the state of a stream cancelled around its
    request's completion, and that state holds the model, so it never unloads and tritonserver
    waits out its exit timeout at shutdown (a canary every few seconds made it likely)."""
    import tritonclient.grpc as grpcclient

    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    answered = False
    deadline = time.monotonic() + timeout_s
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        client.async_stream_infer(
            model, inputs, parameters={"max_tokens": 1}, enable_empty_final_response=True
        )
        while True:
            try:
                result, error = responses.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"deadline: no final response within {timeout_s:g} s") from None
            if error is not None:
                raise error
            final = result.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                answered = True
                return
    finally:
        if answered:
            end_stream(client, max(STREAM_END_S, deadline - time.monotonic()))
        else:
            stop_stream(client)
        client.close()


STREAM_END_S = 2.0  # at least this long for Triton to close a stream whose requests are done


def end_stream(client: Any, timeout_s: float) -> bool:
    """End ``client``'s stream gracefully: half-close it and wait up to ``timeout_s`` for Triton
    to finish the call (it does once every request on it got its final response); cancel it
    (:func:`stop_stream`) only if Triton has not by then. True when it ended without a cancel.
    (tritonclient's ``stop_stream(cancel_requests=False)`` waits without a bound.)"""
    stream = getattr(client, "_stream", None)
    queued = getattr(stream, "_request_queue", None)
    handler = getattr(stream, "_handler", None)
    if queued is None or handler is None:
        stop_stream(client)
        return False
    queued.put(None)  # the end of the request stream: a half-close, not a cancel
    handler.join(timeout_s)
    if handler.is_alive():
        stop_stream(client)
        return False
    client.stop_stream(cancel_requests=False)  # the call is over: returns at once
    return True


def stop_stream(client: Any) -> None:
    """``client.stop_stream(cancel_requests=True)`` without its thread leak: tritonclient then
    never ends the request iterator, so the thread gRPC feeds the stream from blocks forever
    (measured: one thread per canary; the 10-min chaos process reached 4,900 threads)."""
    stream = getattr(client, "_stream", None)
    try:
        client.stop_stream(cancel_requests=True)
    finally:
        queued = getattr(stream, "_request_queue", None)
        if queued is not None:
            queued.put(None)  # the end of the request stream


def error_text(e: BaseException) -> str:
    status = getattr(e, "status", None)
    code = status() if callable(status) else ""
    return f"{type(e).__name__}: {code + ' ' if code else ''}{e}"[:300]


def canary_once(url: str, name: str, config: ModelConfig, timeout_s: float) -> str:
    """ "ok", "overloaded: <error>" or "failed: <error>" of one inference through ``name`` at
    gRPC ``url`` on a connection of its own, bounded by ``timeout_s`` (a decoupled model over a
    stream: :func:`stream_canary`)."""
    import tritonclient.grpc as grpcclient

    inputs = []
    for input_name, value in canary_inputs(config).items():
        tensor = grpcclient.InferInput(
            input_name, list(value.shape), config.input(input_name).wire_dtype
        )
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    try:
        if config.raw.get("model_transaction_policy", {}).get("decoupled"):
            stream_canary(url, name, inputs, timeout_s)
        else:
            client = grpcclient.InferenceServerClient(url)
            try:
                client.infer(name, inputs, client_timeout=timeout_s)
            finally:
                client.close()
        return OK
    except Exception as e:  # any failure is a failed canary; which kind, below
        text = error_text(e)
        return f"{classify_failure(text)}: {text}"


def canary_round(
    url: str,
    configs: Mapping[str, ModelConfig],
    timeout_s: float,
    models: Iterable[str] | None = None,
    concurrent: bool = False,
    cancel: threading.Event | None = None,
) -> dict[str, str]:
    """Model -> :func:`canary_once` of each model of ``configs`` (or only ``models``), one after
    the other, or all at once with ``concurrent`` (a recovery's check of the models it affects:
    its time is then the slowest canary's, not their sum). Once ``cancel`` is set (the
    supervisor stopping for a shutdown) the models not yet checked one after the other are
    skipped."""
    wanted = [n for n in configs if models is None or n in set(models)]
    if not concurrent or len(wanted) < 2:
        results: dict[str, str] = {}
        for n in wanted:
            if cancel is not None and cancel.is_set():
                break
            results[n] = canary_once(url, n, configs[n], timeout_s)
        return results
    with ThreadPoolExecutor(max_workers=len(wanted), thread_name_prefix="canary") as pool:
        futures = {n: pool.submit(canary_once, url, n, configs[n], timeout_s) for n in wanted}
        return {n: f.result() for n, f in futures.items()}
