"""Request encoding and response checking shared by the sync and async clients."""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from tritonforge.client.errors import InvalidRequestError, ResponseError
from tritonforge.pipelines import Pipeline

TRACEPARENT = "traceparent"
_TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")


def check_texts(texts: Sequence[str] | str) -> list[str]:
    """The texts as a list; a bare string is one text. Empty lists and non-strings are rejected."""
    if isinstance(texts, str):
        texts = [texts]
    items = list(texts)
    if not items:
        raise InvalidRequestError("texts is empty: pass at least one string")
    for i, text in enumerate(items):
        if not isinstance(text, str):
            raise InvalidRequestError(f"texts[{i}] must be str, got {type(text).__name__}")
    return items


def chunks(texts: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(texts), size):
        yield texts[start : start + size]


def make_inputs(module: ModuleType, texts: list[str], name: str) -> list[Any]:
    """One BYTES input ``name`` (the pipeline's text input) of shape [n, 1] for
    ``tritonclient.http`` or ``.grpc``."""
    data = np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_)
    infer_input = module.InferInput(name, list(data.shape), "BYTES")
    infer_input.set_data_from_numpy(data)
    return [infer_input]


def make_outputs(module: ModuleType, names: Sequence[str]) -> list[Any]:
    """Requested outputs ``names`` (binary over HTTP)."""
    if module.__name__.startswith("tritonclient.http"):
        return [module.InferRequestedOutput(n, binary_data=True) for n in names]
    return [module.InferRequestedOutput(n) for n in names]


def decode(result: Any, pipeline: Pipeline, expected_rows: int, context: str) -> np.ndarray:
    """An embedding pipeline's output as float32 [n, dim] (dim as discovered);
    :class:`ResponseError` if it is not."""
    output = pipeline.outputs[0]
    array = result.as_numpy(output.name)
    if array is None:
        raise ResponseError(f"{context}: the response has no {output.name!r} output")
    array = np.asarray(array, dtype=np.float32)
    if array.shape != (expected_rows, pipeline.dim):
        raise ResponseError(
            f"{context}: expected {output.name!r} of shape [{expected_rows}, {pipeline.dim}], "
            f"got {list(array.shape)}"
        )
    return array


def _active_span_context() -> dict[str, str]:
    """The active OpenTelemetry span's ``traceparent`` (when opentelemetry-api is installed and a
    valid span is current), else {}."""
    try:
        from opentelemetry import propagate
    except ImportError:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return {TRACEPARENT: carrier[TRACEPARENT]} if TRACEPARENT in carrier else {}


def trace_headers(traceparent: str | None = None) -> dict[str, str]:
    """W3C trace context for one request (HTTP header / gRPC metadata): ``traceparent`` when given,
    else the active OpenTelemetry span's, else a fresh sampled one, so the server's spans (Triton
    ``--trace-config mode=opentelemetry``) always join a trace the caller can name."""
    if traceparent is not None:
        if not _TRACEPARENT.fullmatch(traceparent):
            raise InvalidRequestError(
                f"traceparent must be W3C '00-<32 hex>-<16 hex>-<2 hex>', got {traceparent!r}"
            )
        return {TRACEPARENT: traceparent}
    return _active_span_context() or {
        TRACEPARENT: f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
    }
