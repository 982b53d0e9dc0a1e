"""Canary inferences: one short request through a model, and what its failure means (busy or
broken). The supervisor's readiness checks (:mod:`runtime.supervisor`) are rounds of these."""

from __future__ import annotations

import queue
import re
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from tritonforge.modelconfig import ModelConfig

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
    """One-row sample for every required input: a short text for BYTES, ones otherwise."""
    inputs: dict[str, np.ndarray] = {}
    for spec in config.inputs:
        if spec.optional:
            continue
        shape = tuple(1 if d < 0 else d for d in spec.full_shape(config.batched))
        if np.dtype(spec.numpy_dtype).kind == "O":
            inputs[spec.name] = np.full(shape, CANARY_TEXT, dtype=np.object_)
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
    response within ``timeout_s`` (TimeoutError: no answer in time)."""
    import tritonclient.grpc as grpcclient

    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        client.async_stream_infer(
            model, inputs, parameters={"max_tokens": 1}, enable_empty_final_response=True
        )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                result, error = responses.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"deadline: no final response within {timeout_s:g} s") from None
            if error is not None:
                raise error
            final = result.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                return
    finally:
        stop_stream(client)
        client.close()


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
) -> dict[str, str]:
    """Model -> :func:`canary_once` of each model of ``configs`` (or only ``models``), one after
    the other, or all at once with ``concurrent`` (a recovery's check of the models it affects:
    its time is then the slowest canary's, not their sum)."""
    wanted = [n for n in configs if models is None or n in set(models)]
    if not concurrent or len(wanted) < 2:
        return {n: canary_once(url, n, configs[n], timeout_s) for n in wanted}
    with ThreadPoolExecutor(max_workers=len(wanted), thread_name_prefix="canary") as pool:
        futures = {n: pool.submit(canary_once, url, n, configs[n], timeout_s) for n in wanted}
        return {n: f.result() for n, f in futures.items()}
