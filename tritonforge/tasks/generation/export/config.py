"""config.pbtxt of the decoupled ``generate`` model, rendered from the spec (the one source of
its limits and defaults) and the exported graph (nothing about tensors is restated)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tritonforge.configschema import InstanceGroup, TritonConfig, params, render_compact
from tritonforge.export.report import REPORT_JSON
from tritonforge.generation import FINISH_REASON, TEXT_INPUT, TEXT_OUTPUT
from tritonforge.modelconfig import TensorSpec
from tritonforge.pipelines import (
    DEFAULT_VARIANT_KEY,
    GENERATOR_KEY,
    GENERATOR_ROLE,
    ROLE_KEY,
    TASK_KEY,
    VARIANT_KEY,
    discover_generators,
    repository_configs,
)
from tritonforge.speculation import MAX_NGRAM_KEY, MIN_NGRAM_KEY, TOKENS_KEY
from tritonforge.tasks.generation.export.spec import DecoderSpec
from tritonforge.tasks.generation.structured.logprobs import LOGPROBS_OUTPUT

DECODER_FILE = "decoder.onnx"
TOKENIZER_FILE = "tokenizer.json"
GENERATION_FILE = "generation.json"
VERSION = 1
ROLES = {"decoder": DECODER_FILE, "tokenizer": TOKENIZER_FILE, "generation": GENERATION_FILE}
# The export report's record of the default: {"variant", "models", "int8_refused": [why, ...]}.
DEFAULT_RECORD = "default"

# Optional per-request sampling inputs (also accepted as request parameters).
SAMPLING_INPUTS = (
    ("max_tokens", "TYPE_INT32", 1),
    ("temperature", "TYPE_FP32", 1),
    ("top_p", "TYPE_FP32", 1),
    ("top_k", "TYPE_INT32", 1),
    ("seed", "TYPE_UINT64", 1),
    ("stop", "TYPE_STRING", -1),
    ("chat_template", "TYPE_BOOL", 1),
    ("stream", "TYPE_BOOL", 1),  # accepted for vLLM-style clients; every response streams
)


def exported_variants(spec: DecoderSpec, int8: bool) -> tuple[str, ...]:
    """The served variants: fp32, and int8 when ``int8`` (exported and through its gate)."""
    return tuple(v for v in spec.serving.variants if v == "fp32" or (int8 and v == "int8"))


def int8_served(spec: DecoderSpec, repo: Path, int8: bool) -> bool:
    """Whether ``repo`` serves int8 after an export that asked for it (``int8``): yes unless the
    report of the last export, beside the default model, records int8 refused by its gate
    (then fp32 is the default under the plain name; :data:`DEFAULT_RECORD`)."""
    if not int8:
        return False
    report = repo / spec.serving.model_name / str(VERSION) / REPORT_JSON
    try:
        refused = json.loads(report.read_text())[DEFAULT_RECORD]["int8_refused"]
    except (OSError, ValueError, KeyError, TypeError):
        return True
    return not refused


def stale_models(spec: DecoderSpec, repo: Path, served: Iterable[str]) -> list[str]:
    """Model directories in ``repo`` that an earlier export of ``spec`` generated (their configs
    name its generation group) under a name not in ``served``, e.g. ``generate_int8`` once int8
    became the default: Triton would serve them too."""
    group = discover_generators(repository_configs(repo)).get(spec.serving.model_name)
    keep = set(served)
    return sorted(m for m in (group.models.values() if group else ()) if m not in keep)


def models(spec: DecoderSpec, int8: bool) -> dict[str, str]:
    """Variant -> model name of every exported variant (one Triton model each)."""
    variants = exported_variants(spec, int8)
    return {v: spec.serving.model(v, variants) for v in variants}


def files(spec: DecoderSpec, int8: bool) -> dict[str, str]:
    """``<variant>.<role>`` -> repo-relative path of each sealed artifact: every variant's model
    directory is self-contained (its decoder, tokenizer and generation metadata)."""
    return {
        f"{variant}.{role}": f"{model}/{VERSION}/{name}"
        for variant, model in models(spec, int8).items()
        for role, name in ROLES.items()
    }


def generate_config(spec: DecoderSpec, variant: str, int8: bool) -> TritonConfig:
    """The typed config of the model serving ``variant`` (``int8``: whether int8 is served too,
    exported and through its gate, which decides the names and the default)."""
    s = spec.serving
    variants = exported_variants(spec, int8)
    settings = {
        "decoder_file": DECODER_FILE,
        "tokenizer_file": TOKENIZER_FILE,
        "generation_file": GENERATION_FILE,
        "max_prompt_tokens": s.max_prompt_tokens,
        "max_new_tokens_limit": s.max_new_tokens_limit,
        "default_max_new_tokens": s.default_max_new_tokens,
        "max_running": s.max_running,
        "max_queue": s.max_queue,
        "queue_timeout_s": f"{s.queue_timeout_s:g}",
        "intra_op_threads": s.intra_op_threads,
        "stream_interval_rows": s.stream_interval_rows,
        "stream_interval_max_tokens": s.stream_interval_max_tokens,
        "prefill_chunk_tokens": s.prefill_chunk_tokens,
        "prefill_stall_row_tokens": s.prefill_stall_row_tokens,
        "prefix_cache_entries": s.prefix_cache_entries,
        "prefix_cache_tokens": s.prefix_cache_tokens,
        TOKENS_KEY: s.speculation_tokens,
        MIN_NGRAM_KEY: s.speculation_min_ngram,
        MAX_NGRAM_KEY: s.speculation_max_ngram,
        "warmup_prompt": s.warmup_prompt,
        TASK_KEY: "generation",
        ROLE_KEY: GENERATOR_ROLE,
        GENERATOR_KEY: s.model_name,
        VARIANT_KEY: variant,
        DEFAULT_VARIANT_KEY: s.default_for(variants),
    }
    text = TensorSpec(TEXT_INPUT, "TYPE_STRING", (1,))
    sampling = (TensorSpec(n, t, (d,), optional=True) for n, t, d in SAMPLING_INPUTS)
    return TritonConfig(
        name=s.model(variant, variants),
        backend="python",
        max_batch_size=0,
        decoupled=True,
        inputs=(text, *sampling),
        outputs=(
            TensorSpec(TEXT_OUTPUT, "TYPE_STRING", (1,)),
            TensorSpec(FINISH_REASON, "TYPE_STRING", (1,)),
            # a chunk's token logprobs (JSON), sent only when the request asks for logprobs
            TensorSpec(LOGPROBS_OUTPUT, "TYPE_STRING", (1,)),
        ),
        instance_groups=(InstanceGroup(1),),
        parameters=params(settings),
    )


def render_config(spec: DecoderSpec, variant: str, int8: bool) -> str:
    """config.pbtxt of the model serving ``variant`` (:func:`generate_config`), in the compact
    layout, validated by ``model_config_pb2``."""
    variants = exported_variants(spec, int8)
    comments = (
        f"Generated by `make export` from export/specs/{spec.name}.py; do not edit.",
        "Decoupled: each request streams text_output chunks and ends with exactly one final",
        "response (finish_reason set, or an error). In-flight batching happens inside the model.",
        f"Variant {variant} of {list(variants)} (default {spec.serving.default_for(variants)}).",
    )
    return render_compact(generate_config(spec, variant, int8), comments)


def clean_decoders(repo: Path, specs: list[DecoderSpec]) -> list[str]:
    """Remove what decoder exports generated (artifacts, sidecars, reports, config.pbtxt);
    committed files of the model (``model.py``) stay."""
    removed: list[str] = []
    for spec in specs:
        names = {*models(spec, int8=True).values(), *models(spec, int8=False).values()}
        names |= set(stale_models(spec, repo, ()))  # the group's models under earlier names
        generated = [repo / rel for rel in files(spec, int8=True).values()]
        generated += [repo / rel for rel in files(spec, int8=False).values()]
        for name in sorted(names):
            model = repo / name
            generated += [model / "config.pbtxt", *(model / str(VERSION)).glob("export_report.*")]
        generated = list(dict.fromkeys(generated))
        generated += [p.with_name(p.name + ".sha256") for p in generated]
        for p in generated:
            if p.exists():
                p.unlink()
                removed.append(str(p.relative_to(repo)))
    return removed
