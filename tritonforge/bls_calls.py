"""The BLS's encoder calls: requests of one ``execute`` merged into as few calls as their shapes
allow (:func:`plan_encoder_calls`), one synchronous ``exec`` each (:func:`call_encoder`), and the
output cut back per request (:func:`split_encoder_output`).

Why synchronous ``exec`` and not ``async_exec`` + ``asyncio.gather``: in Triton 2.51 a
non-decoupled model's concurrent ``async_exec`` calls are not overlapped; measured here, requests
then sat 100-800 ms in the *idle* encoder's queue and throughput fell 3-5x at 4 clients
(docs/performance.md). One batched call per shape is both faster and simpler.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tritonforge.batching import Batch, plan_batches, split_outputs
from tritonforge.bls import EncoderTarget
from tritonforge.errors import InvalidInputError, StageUnavailableError


def plan_encoder_calls(
    parts: Sequence[tuple[int, Mapping[str, np.ndarray]]], target: EncoderTarget
) -> list[Batch]:
    """Per-request tokenizer outputs ``(index, tensors)`` -> encoder calls, one per shape.

    Tensors are renamed to the encoder's inputs; requests whose (bucketed) lengths are equal are
    merged into one call, others are not padded further (padding costs CPU time).
    """
    feeds = [(i, {dst: tensors[src] for dst, src in target.inputs.items()}) for i, tensors in parts]
    return plan_batches(feeds)


def split_encoder_output(
    output: np.ndarray, batch: Batch, target: EncoderTarget
) -> list[tuple[int, np.ndarray]]:
    """The encoder's batched output cut back into each member request's rows."""
    return [(i, per[target.output]) for i, per in split_outputs({target.output: output}, batch)]


def _error_code(error: Any) -> Any:
    code = getattr(error, "code", None)
    return code() if callable(code) else None


def call_encoder(
    pb_utils: Any,
    target: EncoderTarget,
    inputs: Mapping[str, np.ndarray],
    timeout_ms: int,
    trace: Any = None,
    version: int = -1,
) -> np.ndarray:
    """One synchronous BLS ``exec``; errors become INVALID_ARG (the stage rejected the caller's
    data) or UNAVAILABLE (not ready, failed, timed out), each naming the stage. ``trace`` (a
    caller request's ``request.trace()``) makes the stage's spans children of that request's."""
    kwargs: dict[str, Any] = {} if trace is None else {"trace": trace}
    if version >= 0:
        kwargs["model_version"] = version
    if timeout_ms > 0:
        kwargs["timeout"] = timeout_ms * 1000  # Triton's request timeout is in microseconds
    request = pb_utils.InferenceRequest(
        model_name=target.model,
        inputs=[pb_utils.Tensor(name, np.ascontiguousarray(v)) for name, v in inputs.items()],
        requested_output_names=[target.output],
        **kwargs,
    )
    try:
        response = request.exec()
    except Exception as e:  # the stub raises TritonModelException when the call cannot be made
        raise StageUnavailableError(f"stage {target.model!r} is unavailable: {e}") from e
    if response.has_error():
        error = response.error()
        message = error.message()
        if _error_code(error) == pb_utils.TritonError.INVALID_ARG:
            raise InvalidInputError(f"stage {target.model!r} rejected the input: {message}")
        raise StageUnavailableError(f"stage {target.model!r} failed: {message}")
    tensor = pb_utils.get_output_tensor_by_name(response, target.output)
    if tensor is None:
        raise StageUnavailableError(f"stage {target.model!r} returned no {target.output!r}")
    return np.asarray(tensor.as_numpy())
