"""The ``embed_bls`` orchestrator's logic: a plan read from the configs, and async stage calls.

:func:`build_plan` resolves, once at load, which models each encoder variant chains and how their
tensors connect (from the sibling configs, never literals). :func:`run_route` runs one request
through the chain with BLS ``async_exec``; ``pb_utils`` is passed in (it exists only in the stub).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tritonforge.errors import InvalidInputError, ModelConfigError, StageUnavailableError
from tritonforge.modelconfig import ModelConfig
from tritonforge.repository import feed_mapping, load_model_config, parse_targets, single_output
from tritonforge.text import TextLimits

VARIANT_PARAMETER = "variant"


@dataclass(frozen=True)
class Stage:
    """One BLS call: ``inputs`` maps this model's input names to the previous stage's outputs."""

    model: str
    inputs: Mapping[str, str]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class BlsPlan:
    """Everything ``embed_bls`` needs per request, resolved at load."""

    text_input: str
    output: str
    routes: Mapping[str, tuple[Stage, ...]]
    default_variant: str
    missing: Mapping[str, str]  # variant -> why it cannot be served (encoder not exported)
    limits: TextLimits
    stage_timeout_ms: int


def build_plan(config: ModelConfig, repository: Path) -> BlsPlan:
    """Read the BLS targets from ``config.parameters`` and check every variant's chain connects.

    A variant whose encoder is not in the repository is kept out of ``routes`` (requests for it
    get UNAVAILABLE); the default variant must be servable. Raises :class:`ModelConfigError` naming the model and tensor that disagree.
    """
    if len(config.inputs) != 1:
        raise ModelConfigError(f"{config.name!r} must have exactly one (text) input")
    text = config.inputs[0]
    output = single_output(config)
    tokenizer = load_model_config(repository, config.param("tokenizer_model", kind=str))
    postprocess = load_model_config(repository, config.param("postprocess_model", kind=str))
    if len(tokenizer.inputs) != 1 or tokenizer.inputs[0].data_type != text.data_type:
        raise ModelConfigError(
            f"{tokenizer.name!r} must take one {text.data_type} input like {config.name!r}"
        )
    post_out = single_output(postprocess)
    if post_out.data_type != output.data_type:
        raise ModelConfigError(
            f"{postprocess.name!r} output {post_out.name!r} is {post_out.data_type}, "
            f"{config.name!r} returns {output.data_type}"
        )
    encoders = parse_targets(config.param("encoder_models", kind=str))
    if not encoders or "" in encoders:
        raise ModelConfigError(
            f"{config.name!r}: parameters.encoder_models must be variant=model pairs, "
            'e.g. "fp32=encoder_fp32,int8=encoder_int8"'
        )
    routes: dict[str, tuple[Stage, ...]] = {}
    tok_stage = Stage(
        tokenizer.name,
        {tokenizer.inputs[0].name: text.name},
        tuple(o.name for o in tokenizer.outputs),
    )
    missing: dict[str, str] = {}
    for variant, name in encoders.items():
        if not (Path(repository) / name).is_dir():
            missing[variant] = f"stage {name!r} is not in the model repository (run `make export`)"
            continue
        encoder = load_model_config(repository, name)
        try:
            enc_map = feed_mapping(tokenizer.outputs, encoder)
            post_map = feed_mapping((single_output(encoder),), postprocess)
        except ModelConfigError as e:
            raise ModelConfigError(f"{config.name!r} variant {variant!r}: {e}") from e
        routes[variant] = (
            tok_stage,
            Stage(encoder.name, enc_map, tuple(o.name for o in encoder.outputs)),
            Stage(postprocess.name, post_map, (post_out.name,)),
        )
    default = config.param("default_variant", kind=str)
    if default not in routes:
        raise ModelConfigError(
            f"{config.name!r}: default_variant {default!r} is not one of {sorted(routes)}"
            + (f" ({missing[default]})" if default in missing else "")
        )
    return BlsPlan(
        text_input=text.name,
        output=output.name,
        routes=routes,
        default_variant=default,
        missing=missing,
        limits=TextLimits(
            max_items=config.param("max_items", config.max_batch_size, int),
            max_text_bytes=config.param("max_text_bytes", TextLimits.max_text_bytes, int),
        ),
        stage_timeout_ms=config.param("stage_timeout_ms", 0, int),
    )


def request_variant(parameters_json: str | Mapping[str, Any] | None, plan: BlsPlan) -> str:
    """The encoder variant a request asks for (request parameter ``variant``) or the default."""
    params: Any = parameters_json or {}
    if isinstance(params, str):
        try:
            params = json.loads(params) if params.strip() else {}
        except json.JSONDecodeError as e:
            raise InvalidInputError(f"request parameters are not valid JSON: {e}") from e
    value = (
        params.get(VARIANT_PARAMETER, plan.default_variant) if isinstance(params, dict) else None
    )
    if isinstance(value, str) and value in plan.missing:
        raise StageUnavailableError(f"variant {value!r}: {plan.missing[value]}")
    if not isinstance(value, str) or value not in plan.routes:
        raise InvalidInputError(
            f"request parameter {VARIANT_PARAMETER!r}={value!r} is unknown; "
            f"use one of {sorted([*plan.routes, *plan.missing])}"
        )
    return value


def text_tensor(texts: list[str]) -> np.ndarray:
    """Validated texts as the ``[n, 1]`` BYTES array the tokenizer takes."""
    return np.array([t.encode("utf-8") for t in texts], dtype=np.object_).reshape(-1, 1)


def _error_code(error: Any) -> Any:
    code = getattr(error, "code", None)
    return code() if callable(code) else None


async def call_stage(
    pb_utils: Any,
    stage: Stage,
    inputs: Mapping[str, np.ndarray],
    timeout_ms: int,
    trace: Any = None,
) -> dict[str, np.ndarray]:
    """One BLS ``async_exec``; errors become INVALID_ARG (the stage rejected the caller's data)
    or UNAVAILABLE (not ready, failed, timed out), each naming the stage. ``trace`` (the caller
    request's ``request.trace()``) makes the stage's spans children of the caller's."""
    kwargs: dict[str, Any] = {} if trace is None else {"trace": trace}
    if timeout_ms > 0:
        kwargs["timeout"] = timeout_ms * 1000  # Triton's request timeout is in microseconds
    request = pb_utils.InferenceRequest(
        model_name=stage.model,
        inputs=[pb_utils.Tensor(name, inputs[src]) for name, src in stage.inputs.items()],
        requested_output_names=list(stage.outputs),
        **kwargs,
    )
    try:
        response = await request.async_exec()
    except Exception as e:  # the stub raises TritonModelException when the call cannot be made
        raise StageUnavailableError(f"stage {stage.model!r} is unavailable: {e}") from e
    if response.has_error():
        error = response.error()
        message = error.message()
        if _error_code(error) == pb_utils.TritonError.INVALID_ARG:
            raise InvalidInputError(f"stage {stage.model!r} rejected the input: {message}")
        raise StageUnavailableError(f"stage {stage.model!r} failed: {message}")
    outputs: dict[str, np.ndarray] = {}
    for name in stage.outputs:
        tensor = pb_utils.get_output_tensor_by_name(response, name)
        if tensor is None:
            raise StageUnavailableError(f"stage {stage.model!r} returned no {name!r}")
        outputs[name] = tensor.as_numpy()
    return outputs


async def run_route(
    pb_utils: Any, plan: BlsPlan, variant: str, texts: np.ndarray, trace: Any = None
) -> np.ndarray:
    """Run one request's texts through the variant's stages; the last stage's output."""
    tensors: dict[str, np.ndarray] = {plan.text_input: texts}
    for stage in plan.routes[variant]:
        tensors = await call_stage(pb_utils, stage, tensors, plan.stage_timeout_ms, trace)
    return next(iter(tensors.values()))
