"""Glue between ``triton_python_backend_utils`` and the plain functions of tritonforge.

Only the code inside a Triton Python model calls these; ``pb_utils`` is passed in (it exists only
inside the stub), so this module imports nothing from Triton itself.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from tritonforge.batching import AxisNames, plan_batches, split_outputs, validate_inputs
from tritonforge.errors import ModelConfigError, ServingError
from tritonforge.modelconfig import ModelConfig

InferFn = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def error_code(pb_utils: Any, exc: BaseException) -> Any:
    code = getattr(exc, "code", "INTERNAL") if isinstance(exc, ServingError) else "INTERNAL"
    return getattr(pb_utils.TritonError, code, pb_utils.TritonError.INTERNAL)


def error_response(pb_utils: Any, exc: BaseException, model: str) -> Any:
    """An InferenceResponse carrying a TritonError: the message, never a traceback."""
    if isinstance(exc, ServingError):
        message = str(exc)
    else:
        # Unexpected: log the traceback on the server, send the caller a short message.
        traceback.print_exc()
        message = f"{model}: internal error ({type(exc).__name__}); see the server log"
    return pb_utils.InferenceResponse(
        error=pb_utils.TritonError(message, error_code(pb_utils, exc))
    )


def decode_request(pb_utils: Any, request: Any, config: ModelConfig) -> dict[str, np.ndarray]:
    """All inputs of one request as numpy arrays, keyed by the config's input names."""
    inputs: dict[str, np.ndarray] = {}
    for spec in config.inputs:
        tensor = pb_utils.get_input_tensor_by_name(request, spec.name)
        if tensor is not None:
            inputs[spec.name] = tensor.as_numpy()
    return inputs


def encode_response(pb_utils: Any, outputs: Mapping[str, np.ndarray], config: ModelConfig) -> Any:
    tensors = []
    for spec in config.outputs:
        if spec.name not in outputs:
            continue
        value = outputs[spec.name]
        if np.dtype(spec.numpy_dtype).kind != "O":
            value = np.ascontiguousarray(value, dtype=spec.numpy_dtype)
        tensors.append(pb_utils.Tensor(spec.name, value))
    return pb_utils.InferenceResponse(output_tensors=tensors)


def execute_batched(
    pb_utils: Any,
    requests: Sequence[Any],
    config: ModelConfig,
    infer: InferFn,
    pad_values: Mapping[str, float | int] | None = None,
    axis_names: AxisNames | None = None,
) -> list[Any]:
    """Validate each request, run the valid ones as few batched inferences as possible, split.

    A bad request fails alone with INVALID_ARG naming the input; the others are answered.
    """
    responses: list[Any] = [None] * len(requests)
    valid: list[tuple[int, dict[str, np.ndarray]]] = []
    for i, request in enumerate(requests):
        try:
            valid.append((i, validate_inputs(config, decode_request(pb_utils, request, config))))
        except ServingError as e:
            responses[i] = error_response(pb_utils, e, config.name)
    for batch in plan_batches(valid, pad_values, axis_names):
        try:
            outputs = infer(batch.inputs)
        except Exception as e:  # one failing batch must not take the others down
            for m in batch.members:
                responses[m.request_index] = error_response(pb_utils, e, config.name)
            continue
        for index, per in split_outputs(outputs, batch, axis_names):
            responses[index] = encode_response(pb_utils, per, config)
    return responses


def parse_mapping(text: str, what: str) -> dict[str, str]:
    """Parse ``"a=1,b=2"`` (config parameter syntax) into a dict."""
    result: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ModelConfigError(f"{what}: expected name=value, got {item!r}")
        result[key.strip()] = value.strip()
    return result


def parse_axis_names(text: str) -> dict[str, list[str | None]]:
    """Parse ``"INPUT__0:batch_size,sequence_length;OUTPUT__0:batch_size,-"`` (``-`` = unnamed)."""
    result: dict[str, list[str | None]] = {}
    for item in filter(None, (p.strip() for p in text.split(";"))):
        name, sep, axes = item.partition(":")
        if not sep:
            raise ModelConfigError(f"axis_names: expected tensor:axis,axis, got {item!r}")
        result[name.strip()] = [
            None if a.strip() in ("", "-") else a.strip() for a in axes.split(",")
        ]
    return result


def pad_values_from(config: ModelConfig) -> dict[str, float | int]:
    """``parameters.pad_values`` ("input_ids=0,attention_mask=0"): inputs that may be padded."""
    raw = parse_mapping(config.parameters.get("pad_values", ""), f"{config.name}.pad_values")
    values: dict[str, float | int] = {}
    for name, value in raw.items():
        config.input(name)  # must name a real input
        values[name] = float(value) if "." in value else int(value)
    return values


class Answers:
    """Each request of an ``execute`` answered exactly once, as soon as its answer is ready,
    through its response sender (a default-mode model may since Python backend 24.06; its
    ``execute`` then returns None). What was not answered when the execute ends gets
    :meth:`fail_pending` (never leave a request without its one final response)."""

    def __init__(self, pb_utils: Any, requests: Sequence[Any]) -> None:
        self._senders = [r.get_response_sender() for r in requests]
        self._final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        self._sent = [False] * len(self._senders)

    def send(self, index: int, response: Any) -> None:
        """Answer request ``index`` (a second answer to it is dropped)."""
        if self._sent[index]:
            return
        self._sent[index] = True
        try:
            self._senders[index].send(response, flags=self._final)
        except Exception:  # the caller went away, or the stub refused: nothing left to answer
            traceback.print_exc()

    def pending(self) -> list[int]:
        return [i for i, sent in enumerate(self._sent) if not sent]

    def fail_pending(self, response: Callable[[], Any]) -> None:
        """Answer every request not answered yet with ``response()`` (an error response)."""
        for i in self.pending():
            self.send(i, response())
