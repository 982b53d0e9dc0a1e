"""The BLS orchestrator's plan: read once at load from the sibling configs, never literals.

:func:`build_plan` resolves how each encoder variant connects to the tokenizer (the BLS tokenizes
in its own process with the tokenizer model's file and settings, one Python hop fewer than calling
it), which variants are servable, the versions and canary split, and the degrade policy. The
per-request readers are in :mod:`tritonforge.bls_parameters`, the encoder calls in
:mod:`tritonforge.bls_calls`, degradation in :mod:`tritonforge.bls_degrade`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tritonforge.bls_degrade import DegradePolicy
from tritonforge.classify import read_labels
from tritonforge.errors import ModelConfigError
from tritonforge.modelconfig import ModelConfig, TensorSpec
from tritonforge.repository import feed_mapping, load_model_config, parse_targets, single_output
from tritonforge.text import TextLimits

VERSION_OUTPUT = "model_version"
VARIANT_OUTPUT = "variant"
_MARK_OUTPUTS = (VERSION_OUTPUT, VARIANT_OUTPUT)  # say who answered; not the model's own


@dataclass(frozen=True)
class EncoderTarget:
    """One variant's encoder: the model, its inputs fed from tokenizer outputs, and its output."""

    model: str
    inputs: Mapping[str, str]  # encoder input name -> tokenizer output name
    output: str
    instances: int = 1  # the encoder's instance_group count: calls it can run at once


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
class BlsPlan:
    """Everything the BLS needs per request, resolved at load."""

    text_input: str
    output: str  # embeddings: the one output; classifiers: the encoder's logits are postprocessed
    tokenizer: TokenizerSettings
    encoders: Mapping[str, EncoderTarget]  # variant -> its encoder (servable ones only)
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

    @property
    def max_concurrent_calls(self) -> int:
        """Encoder calls one execute runs at once: as many as an encoder has instances (more
        would only wait in the encoder's queue)."""
        return max((e.instances for e in self.encoders.values()), default=1)


def latest_version_dir(model_dir: Path) -> Path:
    """The highest numbered version directory of a model (what Triton serves as latest)."""
    versions = sorted(
        (p for p in model_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
    )
    if not versions:
        raise ModelConfigError(f"{model_dir.name!r} has no numbered version directory")
    return versions[-1]


def tokenizer_settings(repository: Path, tokenizer: ModelConfig) -> TokenizerSettings:
    """The tokenizer model's file and knobs, read from its config (its ``parameters``)."""
    version = latest_version_dir(Path(repository) / tokenizer.name)
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

    A variant whose encoder is not in the repository is kept out of ``encoders`` (requests for
    it get UNAVAILABLE); the default variant must be servable. Raises :class:`ModelConfigError`
    naming the model and tensor that disagree.
    """
    if len(config.inputs) != 1:
        raise ModelConfigError(f"{config.name!r} must have exactly one (text) input")
    text = config.inputs[0]
    post = (
        postprocess_settings(config, repository)
        if "postprocess_model" in config.parameters
        else None
    )
    output = _answer_tensor(config, repository, post)
    tokenizer = load_model_config(repository, config.param("tokenizer_model", kind=str))
    if len(tokenizer.inputs) != 1 or tokenizer.inputs[0].data_type != text.data_type:
        raise ModelConfigError(
            f"{tokenizer.name!r} must take one {text.data_type} input like {config.name!r}"
        )
    encoders, missing = encoder_targets(config, repository, tokenizer, output, post)
    default = config.param("default_variant", kind=str)
    _check_servable(config, "default_variant", default, encoders, missing)
    versions, weights = _versions(config)
    degrade = DegradePolicy.from_config(config)
    if degrade.enabled:
        _check_servable(config, "degrade_to", degrade.to, encoders, missing)
    outputs = {o.name for o in config.outputs}
    return BlsPlan(
        text_input=text.name,
        output=output.name,
        tokenizer=tokenizer_settings(repository, tokenizer),
        encoders=encoders,
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


def _answer_tensor(config: ModelConfig, repository: Path, post: Postprocess | None) -> TensorSpec:
    """What every encoder must produce: the postprocess model's input (classifiers), else the
    BLS's one output other than the who-answered marks (embeddings)."""
    if post is not None:
        return load_model_config(repository, post.model).inputs[0]
    return single_output(
        dataclasses.replace(
            config, outputs=tuple(o for o in config.outputs if o.name not in _MARK_OUTPUTS)
        )
    )


def encoder_targets(
    config: ModelConfig,
    repository: Path,
    tokenizer: ModelConfig,
    output: TensorSpec,
    post: Postprocess | None,
) -> tuple[dict[str, EncoderTarget], dict[str, str]]:
    """``(encoders, missing)`` from ``parameters.encoder_models``: each exported variant's encoder
    fed from ``tokenizer`` and producing ``output``; variants not exported, with the reason."""
    named = parse_targets(config.param("encoder_models", kind=str))
    if not named or "" in named:
        raise ModelConfigError(
            f"{config.name!r}: parameters.encoder_models must be variant=model pairs, "
            'e.g. "fp32=encoder_fp32,int8=encoder_int8"'
        )
    encoders: dict[str, EncoderTarget] = {}
    missing: dict[str, str] = {}
    for variant, name in named.items():
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
        encoders[variant] = EncoderTarget(
            encoder.name, enc_map, enc_out.name, instance_count(encoder)
        )
    return encoders, missing


def instance_count(config: ModelConfig) -> int:
    """Instances of a model (the sum of its ``instance_group`` counts; Triton's default 1)."""
    groups = config.raw.get("instance_group") or [{}]
    return max(1, sum(int(g.get("count", 1)) for g in groups))


def _check_servable(
    config: ModelConfig,
    parameter: str,
    variant: str,
    encoders: Mapping[str, EncoderTarget],
    missing: Mapping[str, str],
) -> None:
    if variant not in encoders:
        raise ModelConfigError(
            f"{config.name!r}: {parameter} {variant!r} is not one of {sorted(encoders)}"
            + (f" ({missing[variant]})" if variant in missing else "")
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
