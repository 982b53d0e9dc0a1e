"""The BLS orchestrators' logic: a plan read from the configs, and batched stage calls.

:func:`build_plan` resolves, once at load, how each encoder variant connects to the tokenizer
(from the sibling configs, never literals). The BLS model tokenizes in its own process with the
tokenizer model's file and settings (one Python hop fewer than calling it) and runs the requests of
one ``execute`` as few encoder calls as their shapes allow (:func:`plan_encoder_calls`).

Why synchronous ``exec`` and not ``async_exec`` + ``asyncio.gather``: in Triton 2.51 a
non-decoupled model's concurrent ``async_exec`` calls are not overlapped; measured here, requests
then sat 100-800 ms in the *idle* encoder's queue and throughput fell 3-5x at 4 clients
(docs/performance.md). One batched call per shape is both faster and simpler.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tritonforge.batching import Batch, plan_batches, split_outputs
from tritonforge.classify import TOP_K_PARAMETER, check_top_k, read_labels
from tritonforge.errors import InvalidInputError, ModelConfigError, StageUnavailableError, shown
from tritonforge.modelconfig import ModelConfig
from tritonforge.repository import feed_mapping, load_model_config, parse_targets, single_output
from tritonforge.text import TextLimits

VARIANT_PARAMETER = "variant"
VERSION_PARAMETER = "version"
VERSION_OUTPUT = "model_version"
VARIANT_OUTPUT = "variant"
FALLBACK_PARAMETER = "fallback"
NO_FALLBACK = "none"
DEGRADED_METRIC = "tritonforge_degraded_answers_total"
# Triton's words when a model's queue refuses a request (full, or waited past its timeout).
_REFUSED_HINTS = ("exceeds maximum queue size", "request timeout expired")
# Two executes of one instance closer than this ran back to back: the queue was not empty.
# Measured under load (2 shared cores): the stub's gap between back-to-back executes exceeded
# 5 ms, so 5 ms never saw a queue; 50 ms does, and an idle instance rarely restarts that soon.
BUSY_GAP_S = 0.05


_MARK_OUTPUTS = (VERSION_OUTPUT, VARIANT_OUTPUT)  # say who answered; not the model's own


@dataclass(frozen=True)
class EncoderRoute:
    """One variant: the encoder model, its inputs fed from tokenizer outputs, and its output."""

    model: str
    inputs: Mapping[str, str]  # encoder input name -> tokenizer output name
    output: str


@dataclass(frozen=True)
class TokenizerSettings:
    """What the BLS needs to tokenize exactly as the ``tokenizer`` model does."""

    model: str
    path: Path
    max_length: int
    pad_to_multiple_of: int
    outputs: tuple[str, ...] = ("input_ids", "attention_mask", "token_type_ids")
    pad_id: int = 0


@dataclass(frozen=True)
class Postprocess:
    """Classification: the labels and default top-k of the pipeline's postprocess model."""

    model: str
    labels: tuple[str, ...]
    top_k: int


@dataclass(frozen=True)
class DegradePolicy:
    """When to answer from ``to`` instead of the default variant (``parameters.degrade_*``).

    ``enabled``: for every request that does not forbid it; else only for those asking for it.
    """

    enabled: bool = False
    to: str = "int8"
    max_queued: int = 4
    max_queue_delay_ms: int = 250

    @classmethod
    def from_config(cls, config: ModelConfig) -> DegradePolicy:
        enabled = config.param("degrade_enabled", "false", str).strip().lower()
        if enabled not in ("true", "false"):
            raise ModelConfigError(
                f"{config.name!r}: parameters.degrade_enabled must be true or false, got "
                f"{enabled!r}"
            )
        policy = cls(
            enabled=enabled == "true",
            to=config.param("degrade_to", cls.to, str),
            max_queued=config.param("degrade_max_queued", cls.max_queued, int),
            max_queue_delay_ms=config.param(
                "degrade_max_queue_delay_ms", cls.max_queue_delay_ms, int
            ),
        )
        if policy.max_queued < 1 or policy.max_queue_delay_ms < 1:
            raise ModelConfigError(
                f"{config.name!r}: parameters.degrade_max_queued / degrade_max_queue_delay_ms "
                "must be >= 1"
            )
        return policy


@dataclass(frozen=True)
class BlsPlan:
    """Everything the BLS needs per request, resolved at load."""

    text_input: str
    output: str  # embeddings: the one output; classifiers: the encoder's logits are postprocessed
    tokenizer: TokenizerSettings
    routes: Mapping[str, EncoderRoute]
    default_variant: str
    missing: Mapping[str, str]  # variant -> why it cannot be served (encoder not exported)
    limits: TextLimits
    stage_timeout_ms: int
    postprocess: Postprocess | None = None
    versions: tuple[int, ...] = ()  # the encoders' served versions (several: A/B)
    weights: Mapping[int, int] = field(default_factory=dict)  # canary split, percent per version
    version_output: str | None = None  # the output that says which version answered
    variant_output: str | None = None  # the output that says which variant answered
    degrade: DegradePolicy = field(default_factory=DegradePolicy)


class LoadMonitor:
    """One BLS instance's view of its own queue, from the executes it runs (no server calls).

    Each ``execute`` receives every request that waited while the instance was busy, so the
    number of requests is the backlog it found; when it starts right after the previous one
    ended (within :data:`BUSY_GAP_S`) the oldest of them waited at most since the previous
    one started, the delay estimate. ``clock`` is injectable for tests.
    """

    def __init__(self, policy: DegradePolicy, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self.clock = clock
        self._last_start: float | None = None
        self._last_end: float | None = None

    def start(self, n_requests: int) -> bool:
        """Record an execute's start; True when the instance is overloaded (degrade)."""
        now = self.clock()
        waited_s = 0.0
        last_start, last_end = self._last_start, self._last_end
        if last_start is not None and last_end is not None and now - last_end <= BUSY_GAP_S:
            waited_s = now - last_start
        self._last_start = now
        return (
            n_requests > self.policy.max_queued
            or waited_s * 1000.0 >= self.policy.max_queue_delay_ms
        )

    def end(self) -> None:
        self._last_end = self.clock()


def refused(error: BaseException) -> bool:
    """True when a stage call failed because the stage's queue refused it (full or timed out)."""
    message = str(error).lower()
    return isinstance(error, StageUnavailableError) and any(h in message for h in _REFUSED_HINTS)


def _latest_version(model_dir: Path) -> Path:
    versions = sorted(
        (p for p in model_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
    )
    if not versions:
        raise ModelConfigError(f"{model_dir.name!r} has no numbered version directory")
    return versions[-1]


def tokenizer_settings(repository: Path, tokenizer: ModelConfig) -> TokenizerSettings:
    """The tokenizer model's file and knobs, read from its config (its ``parameters``)."""
    version = _latest_version(Path(repository) / tokenizer.name)
    return TokenizerSettings(
        model=tokenizer.name,
        path=version / tokenizer.param("tokenizer_file", kind=str),
        max_length=tokenizer.param("max_length", kind=int),
        pad_to_multiple_of=tokenizer.param("pad_to_multiple_of", 1, int),
        outputs=tuple(t.name for t in tokenizer.outputs),
        pad_id=tokenizer.param("pad_id", 0, int),
    )


def build_plan(config: ModelConfig, repository: Path) -> BlsPlan:
    """Read the BLS targets from ``config.parameters`` and check every variant's chain connects.

    A variant whose encoder is not in the repository is kept out of ``routes`` (requests for it
    get UNAVAILABLE); the default variant must be servable. Raises :class:`ModelConfigError`
    naming the model and tensor that disagree.
    """
    if len(config.inputs) != 1:
        raise ModelConfigError(f"{config.name!r} must have exactly one (text) input")
    text = config.inputs[0]
    post = None
    if "postprocess_model" in config.parameters:
        post = postprocess_settings(config, repository)
        expected = load_model_config(repository, post.model).inputs[0]
        output = expected
    else:
        output = single_output(
            dataclasses.replace(
                config, outputs=tuple(o for o in config.outputs if o.name not in _MARK_OUTPUTS)
            )
        )
    tokenizer = load_model_config(repository, config.param("tokenizer_model", kind=str))
    if len(tokenizer.inputs) != 1 or tokenizer.inputs[0].data_type != text.data_type:
        raise ModelConfigError(
            f"{tokenizer.name!r} must take one {text.data_type} input like {config.name!r}"
        )
    encoders = parse_targets(config.param("encoder_models", kind=str))
    if not encoders or "" in encoders:
        raise ModelConfigError(
            f"{config.name!r}: parameters.encoder_models must be variant=model pairs, "
            'e.g. "fp32=encoder_fp32,int8=encoder_int8"'
        )
    routes: dict[str, EncoderRoute] = {}
    missing: dict[str, str] = {}
    for variant, name in encoders.items():
        if not (Path(repository) / name).is_dir():
            missing[variant] = f"stage {name!r} is not in the model repository (run `make export`)"
            continue
        encoder = load_model_config(repository, name)
        try:
            enc_map = feed_mapping(tokenizer.outputs, encoder)
            enc_out = single_output(encoder)
        except ModelConfigError as e:
            raise ModelConfigError(f"{config.name!r} variant {variant!r}: {e}") from e
        if enc_out.data_type != output.data_type or enc_out.dims != output.dims:
            consumer = f"{post.model!r} takes" if post else f"{config.name!r} returns"
            raise ModelConfigError(
                f"{config.name!r} variant {variant!r}: {name!r} output {enc_out.name!r} is "
                f"{enc_out.data_type} {list(enc_out.dims)}, {consumer} "
                f"{output.data_type} {list(output.dims)}"
            )
        routes[variant] = EncoderRoute(encoder.name, enc_map, enc_out.name)
    default = config.param("default_variant", kind=str)
    if default not in routes:
        raise ModelConfigError(
            f"{config.name!r}: default_variant {default!r} is not one of {sorted(routes)}"
            + (f" ({missing[default]})" if default in missing else "")
        )
    versions, weights = _versions(config)
    degrade = DegradePolicy.from_config(config)
    if degrade.enabled and degrade.to not in routes:
        raise ModelConfigError(
            f"{config.name!r}: degrade_to {degrade.to!r} is not one of {sorted(routes)}"
            + (f" ({missing[degrade.to]})" if degrade.to in missing else "")
        )
    outputs = {o.name for o in config.outputs}
    return BlsPlan(
        text_input=text.name,
        output=output.name,
        tokenizer=tokenizer_settings(repository, tokenizer),
        routes=routes,
        default_variant=default,
        missing=missing,
        limits=TextLimits(
            max_items=config.param("max_items", config.max_batch_size, int),
            max_text_bytes=config.param("max_text_bytes", TextLimits.max_text_bytes, int),
        ),
        stage_timeout_ms=config.param("stage_timeout_ms", 0, int),
        postprocess=post,
        versions=versions,
        weights=weights,
        version_output=VERSION_OUTPUT if VERSION_OUTPUT in outputs else None,
        variant_output=VARIANT_OUTPUT if VARIANT_OUTPUT in outputs else None,
        degrade=degrade,
    )


def _versions(config: ModelConfig) -> tuple[tuple[int, ...], dict[int, int]]:
    """``parameters.versions`` ("1,2") and ``parameters.version_weights`` ("1=10,2=90")."""
    try:
        versions = tuple(int(v) for v in config.param("versions", "", str).split(",") if v)
        weights = {
            int(k): int(v)
            for k, v in parse_targets(config.param("version_weights", "", str)).items()
        }
    except ValueError as e:
        raise ModelConfigError(
            f"{config.name!r}: parameters.versions / version_weights: {e}"
        ) from e
    if weights and (sum(weights.values()) != 100 or set(weights) - set(versions)):
        raise ModelConfigError(
            f"{config.name!r}: version_weights {weights} must be percents of versions "
            f"{list(versions)} summing to 100"
        )
    return versions, weights


def canary_bucket(key: str) -> int:
    """A stable bucket in [0, 100) for ``key`` (sha256: the same on every host and run)."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") % 100


def request_version(
    parameters_json: str | Mapping[str, Any] | None, key: str, plan: BlsPlan
) -> int:
    """The encoder version for a request: the ``version`` request parameter when given (one of
    the plan's versions), else the canary split by ``key`` (the request id, or its texts), else
    -1 (Triton's latest)."""
    value = _parameters(parameters_json).get(VERSION_PARAMETER)
    if value is not None:
        try:
            text = str(value).strip()
            version = int(text) if len(text) <= 12 else -2
        except (TypeError, ValueError):
            version = -2
        if isinstance(value, bool) or version not in plan.versions:
            raise InvalidInputError(
                f"request parameter {VERSION_PARAMETER!r}={shown(value)} is unknown; "
                f"use one of {list(plan.versions) or '(this pipeline has one version)'}"
            )
        return version
    if plan.weights:
        bucket, edge = canary_bucket(key), 0
        for version, percent in sorted(plan.weights.items()):
            edge += percent
            if bucket < edge:
                return version
    return max(plan.versions) if plan.versions else -1


def postprocess_settings(config: ModelConfig, repository: Path) -> Postprocess:
    """The classification postprocess model's labels (its probabilities output's label file) and
    default ``top_k``; the BLS's outputs must be the postprocess model's (names, dtypes)."""
    post = load_model_config(repository, config.param("postprocess_model", kind=str))
    probabilities = post.output("probabilities")
    label_file = probabilities.label_filename
    if not label_file:
        raise ModelConfigError(f"{post.name!r}: output 'probabilities' has no label_filename")
    labels = read_labels(Path(repository) / post.name / label_file)
    theirs = {(t.name, t.data_type) for t in post.outputs}
    ours = {(t.name, t.data_type) for t in config.outputs if t.name not in _MARK_OUTPUTS}
    if theirs != ours:
        raise ModelConfigError(
            f"{config.name!r} outputs {sorted(ours)} differ from {post.name!r}'s {sorted(theirs)}"
        )
    return Postprocess(post.name, labels, post.param("top_k", 1, int))


def request_top_k(parameters_json: str | Mapping[str, Any] | None, post: Postprocess) -> int:
    """The ``top_k`` a request asks for (request parameter), else the postprocess default."""
    params = _parameters(parameters_json)
    if TOP_K_PARAMETER not in params:
        return post.top_k
    return check_top_k(params[TOP_K_PARAMETER], len(post.labels))


def _parameters(parameters_json: str | Mapping[str, Any] | None) -> Mapping[str, Any]:
    params: Any = parameters_json or {}
    if isinstance(params, str):
        try:
            params = json.loads(params) if params.strip() else {}
        except ValueError as e:  # JSONDecodeError, or an integer past 4300 digits
            raise InvalidInputError(
                f"request parameters are not valid JSON: {shown(str(e))}"
            ) from e
    if not isinstance(params, Mapping):
        raise InvalidInputError(f"request parameters must be a JSON object, got {shown(params)}")
    return params


def request_variant(parameters_json: str | Mapping[str, Any] | None, plan: BlsPlan) -> str:
    """The encoder variant a request asks for (request parameter ``variant``) or the default."""
    value = _parameters(parameters_json).get(VARIANT_PARAMETER, plan.default_variant)
    if isinstance(value, str) and value in plan.missing:
        raise StageUnavailableError(f"variant {value!r}: {plan.missing[value]}")
    if not isinstance(value, str) or value not in plan.routes:
        raise InvalidInputError(
            f"request parameter {VARIANT_PARAMETER!r}={shown(value)} is unknown; "
            f"use one of {sorted([*plan.routes, *plan.missing])}"
        )
    return value


def request_fallback(
    parameters_json: str | Mapping[str, Any] | None, variant: str, plan: BlsPlan
) -> str | None:
    """The variant this request may be answered from when ``variant`` is overloaded, or None.

    Request parameter ``fallback``: a variant name (opt in, whatever the pipeline's setting) or
    ``"none"`` (forbid). Without it, the pipeline's ``degrade`` setting decides, and only for
    requests that did not pin a ``variant``.
    """
    params = _parameters(parameters_json)
    value = params.get(FALLBACK_PARAMETER)
    if value is None:
        pinned = VARIANT_PARAMETER in params
        chosen = plan.degrade.to if plan.degrade.enabled and not pinned else None
    elif isinstance(value, str) and value.strip().lower() == NO_FALLBACK:
        return None
    elif isinstance(value, str) and value in plan.routes:
        chosen = value
    elif isinstance(value, str) and value in plan.missing:
        raise StageUnavailableError(
            f"{FALLBACK_PARAMETER} variant {value!r}: {plan.missing[value]}"
        )
    else:
        shown = repr(value) if len(repr(value)) <= 40 else f"<{len(repr(value))} characters>"
        raise InvalidInputError(
            f"request parameter {FALLBACK_PARAMETER!r}={shown} is unknown; use "
            f"{NO_FALLBACK!r} or one of {sorted(plan.routes)}"
        )
    return None if chosen == variant else chosen


def degraded_counter(pb_utils: Any, pipeline: str, model: str) -> Callable[[str, int], None]:
    """``count(to_variant, n)``: Triton's custom metric :data:`DEGRADED_METRIC` (``/metrics``),
    labelled by pipeline, model and variant; a no-op where the stub has no metrics API."""
    family_cls = getattr(pb_utils, "MetricFamily", None)
    if family_cls is None:
        return lambda _to, _n: None
    family = family_cls(
        name=DEGRADED_METRIC,
        description="answers served by a degraded (cheaper) variant because the default one "
        "was overloaded",
        kind=family_cls.COUNTER,
    )
    metrics: dict[str, Any] = {}

    def count(to: str, n: int) -> None:
        if to not in metrics:
            metrics[to] = family.Metric(labels={"pipeline": pipeline, "model": model, "to": to})
        metrics[to].increment(n)

    return count


def plan_encoder_calls(
    parts: Sequence[tuple[int, Mapping[str, np.ndarray]]], route: EncoderRoute
) -> list[Batch]:
    """Per-request tokenizer outputs ``(index, tensors)`` -> encoder calls, one per shape.

    Tensors are renamed to the encoder's inputs; requests whose (bucketed) lengths are equal are
    merged into one call, others are not padded further (padding costs CPU time).
    """
    feeds = [(i, {dst: tensors[src] for dst, src in route.inputs.items()}) for i, tensors in parts]
    return plan_batches(feeds)


def split_encoder_output(
    output: np.ndarray, batch: Batch, route: EncoderRoute
) -> list[tuple[int, np.ndarray]]:
    """The encoder's batched output cut back into each member request's rows."""
    return [(i, per[route.output]) for i, per in split_outputs({route.output: output}, batch)]


def _error_code(error: Any) -> Any:
    code = getattr(error, "code", None)
    return code() if callable(code) else None


def call_encoder(
    pb_utils: Any,
    route: EncoderRoute,
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
        model_name=route.model,
        inputs=[pb_utils.Tensor(name, np.ascontiguousarray(v)) for name, v in inputs.items()],
        requested_output_names=[route.output],
        **kwargs,
    )
    try:
        response = request.exec()
    except Exception as e:  # the stub raises TritonModelException when the call cannot be made
        raise StageUnavailableError(f"stage {route.model!r} is unavailable: {e}") from e
    if response.has_error():
        error = response.error()
        message = error.message()
        if _error_code(error) == pb_utils.TritonError.INVALID_ARG:
            raise InvalidInputError(f"stage {route.model!r} rejected the input: {message}")
        raise StageUnavailableError(f"stage {route.model!r} failed: {message}")
    tensor = pb_utils.get_output_tensor_by_name(response, route.output)
    if tensor is None:
        raise StageUnavailableError(f"stage {route.model!r} returned no {route.output!r}")
    return np.asarray(tensor.as_numpy())
