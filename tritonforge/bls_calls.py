"""The BLS's encoder calls: requests of one ``execute`` merged into as few calls as their shapes
allow (:func:`plan_encoder_calls`, :class:`EncoderCall`), one synchronous ``exec`` each
(:func:`call_encoder`), run concurrently on a thread pool and handed back as each finishes
(:func:`run_calls`, retried on the spare variant when the encoder's queue refuses:
:func:`call_with_spare`), and the output cut back per request (:func:`split_encoder_output`).

Why threads with the synchronous ``exec`` and not ``async def execute`` + ``async_exec``: in
Triton 2.51 a non-decoupled ``async def execute`` does not overlap executes (server#7888), and
that shape was measured 3-5x slower here (docs/performance.md). ``exec`` releases the GIL while
it waits for the stage, and the parent process serves BLS calls from a thread pool, so the calls
of one execute made from several threads do overlap.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, as_completed
from dataclasses import dataclass
from typing import Any

import numpy as np

from tritonforge.batching import Batch, plan_batches, split_outputs
from tritonforge.bls import EncoderTarget
from tritonforge.bls_degrade import refused
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


@dataclass(frozen=True)
class EncoderCall:
    """One encoder call of an execute: ``batch`` for ``variant`` (``requested``, unless the
    instance is overloaded and degraded it), pinned to ``version`` (-1: the latest); ``spare``
    is the variant to retry on when the encoder's queue refuses the call (None: no retry)."""

    batch: Batch
    requested: str
    variant: str
    version: int = -1
    spare: str | None = None


@dataclass(frozen=True)
class CallResult:
    """What an :class:`EncoderCall` produced: the variant that answered and its output, or the
    error every member request gets."""

    call: EncoderCall
    variant: str
    output: np.ndarray | None = None
    error: Exception | None = None

    @property
    def degraded(self) -> bool:
        return self.error is None and self.variant != self.call.requested


RunFn = Callable[[EncoderCall, EncoderTarget], np.ndarray]
"""``run(call, target) -> output``: one ``exec`` of ``call.batch`` on ``target``."""


def call_with_spare(
    call: EncoderCall, encoders: Mapping[str, EncoderTarget], run: RunFn
) -> CallResult:
    """``call`` on its variant's encoder; when that encoder's queue refused it (full, or timed
    out) and the call has a spare variant fed the same inputs, once more on the spare. Never
    raises: an error is returned in the result."""
    target = encoders[call.variant]
    try:
        return CallResult(call, call.variant, run(call, target))
    except Exception as e:
        spare = encoders.get(call.spare or "")
        if spare is None or spare.inputs != target.inputs or not refused(e):
            return CallResult(call, call.variant, error=e)
    assert call.spare is not None
    try:
        return CallResult(call, call.spare, run(call, spare))
    except Exception as e:
        return CallResult(call, call.spare, error=e)


def run_calls(
    calls: Sequence[EncoderCall],
    encoders: Mapping[str, EncoderTarget],
    run: RunFn,
    pool: Executor | None = None,
) -> Iterator[CallResult]:
    """Every call's :class:`CallResult`, each as soon as it is done: concurrently on ``pool``
    (completion order), or one after another in this thread (no pool, or a single call)."""
    if pool is None or len(calls) < 2:
        for call in calls:
            yield call_with_spare(call, encoders, run)
        return
    futures = [pool.submit(call_with_spare, call, encoders, run) for call in calls]
    for future in as_completed(futures):
        yield future.result()
