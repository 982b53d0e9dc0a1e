"""Read sibling models' configs from a model repository and check that tensors connect.

Used at load time by the ``tokenizer`` and ``embed_bls`` models (to refuse a repository whose
stages disagree) and by the repository lint (``python -m tritonforge.runtime lint``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from tritonforge.errors import ModelConfigError
from tritonforge.modelconfig import ModelConfig, TensorSpec

CONFIG_FILE = "config.pbtxt"
# A model whose BYTES input is not text declares a valid item for the canaries (an image):
# this parameter, base64 (runtime.supervisor.canaries; absent: a short text).
CANARY_KEY = "canary_b64"
_INDEXED = re.compile(r"^(INPUT|OUTPUT)__(\d+)$")


def load_model_config(repository: Path, name: str) -> ModelConfig:
    """Parse ``<repository>/<name>/config.pbtxt``; a missing one says run make export."""
    path = Path(repository) / name / CONFIG_FILE
    if not path.is_file():
        raise ModelConfigError(
            f"model {name!r} is missing from {repository} (run `make export`: it generates "
            "every model of a pipeline)"
        )
    try:
        config = ModelConfig.from_pbtxt(path.read_text())
    except ModelConfigError as e:
        raise ModelConfigError(f"{path}: {e}") from e
    if config.name and config.name != name:
        raise ModelConfigError(f"{path}: name {config.name!r} differs from its directory {name!r}")
    return config


def model_names(repository: Path) -> list[str]:
    """Directory names in ``repository`` that look like models (hold a config or a version)."""
    return sorted(
        p.name
        for p in Path(repository).iterdir()
        if p.is_dir()
        and not p.name.startswith(".")
        and ((p / CONFIG_FILE).exists() or any(c.name.isdigit() for c in p.iterdir()))
    )


def feed_mapping(
    produced: Sequence[TensorSpec], consumer: ModelConfig, positional: bool = True
) -> dict[str, str]:
    """Map each input of ``consumer`` to the produced tensor that feeds it.

    Names must match; with ``positional``, a consumer using the native PyTorch-backend
    convention (``INPUT__<i>``) is fed by position instead, and one produced tensor feeds a
    consumer's only input whatever their names. Dtypes must agree. Raises
    :class:`ModelConfigError` with every disagreement.
    """
    by_name = {t.name: t for t in produced}
    required = [s for s in consumer.inputs if not s.optional]
    indexed = [_INDEXED.match(s.name) for s in consumer.inputs]
    if positional and len(produced) == 1 and len(consumer.inputs) == 1:
        mapping = {consumer.inputs[0].name: produced[0].name}
    elif positional and consumer.inputs and all(indexed) and not (set(by_name) & _names(required)):
        ordered = sorted(consumer.inputs, key=lambda s: int(_INDEXED.match(s.name).group(2)))  # type: ignore[union-attr]
        if len(ordered) != len(produced):
            raise ModelConfigError(
                f"model {consumer.name!r} takes {len(ordered)} positional inputs but "
                f"{len(produced)} tensors are produced ({[t.name for t in produced]})"
            )
        mapping = {spec.name: src.name for spec, src in zip(ordered, produced, strict=True)}
    else:
        mapping = {s.name: s.name for s in consumer.inputs if s.name in by_name}
    problems: list[str] = []
    for spec in required:
        if spec.name not in mapping:
            problems.append(f"input {spec.name!r} of {consumer.name!r} is not produced")
    for dst, src in mapping.items():
        want, got = consumer.input(dst).data_type, by_name[src].data_type
        if want != got:
            problems.append(f"{src!r} is {got} but input {dst!r} of {consumer.name!r} wants {want}")
    unused = sorted(set(by_name) - set(mapping.values()))
    if unused:
        problems.append(f"{unused} produced but not inputs of {consumer.name!r}")
    if problems:
        raise ModelConfigError("; ".join(problems))
    return mapping


def _names(specs: Sequence[TensorSpec]) -> set[str]:
    return {s.name for s in specs}


def single_output(config: ModelConfig) -> TensorSpec:
    """The one output of ``config`` (encoders have exactly one)."""
    if len(config.outputs) != 1:
        raise ModelConfigError(
            f"model {config.name!r} must have exactly one output, has {len(config.outputs)}"
        )
    return config.outputs[0]


def parse_targets(value: str) -> dict[str, str]:
    """``"fp32=encoder_fp32,int8=encoder_int8"`` -> dict; a bare ``"tokenizer"`` -> ``{"": ...}``."""
    targets: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in value.split(","))):
        key, sep, model = item.partition("=")
        targets[key.strip() if sep else ""] = (model if sep else key).strip()
    return targets


def referenced_models(parameters: Mapping[str, str]) -> dict[str, str]:
    """Models a Python model names in ``parameters`` keys ending in ``_model``/``_models``.

    This is the declaration the lint reads to check BLS targets exist and to find cycles.
    Returns ``"<key>[<variant>]" -> model name``.
    """
    refs: dict[str, str] = {}
    for key, value in parameters.items():
        if key.endswith(("_model", "_models")):
            for variant, model in parse_targets(value).items():
                refs[f"{key}[{variant}]" if variant else key] = model
    return refs
