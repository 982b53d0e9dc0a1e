"""The causal-LM families the decoder export takes, in one place.

A family is the checkpoint's ``model_type`` (its ``config.json``, or the GGUF's architecture as
transformers reads it); each maps to the ``*ForCausalLM`` architecture that ONNX Runtime GenAI's
model builder (0.18, ``onnxruntime_genai.models.builder``) dispatches on and that the export's
verification was run with (tests/tiny_decoders.py builds one tiny checkpoint per family).
The builder knows more architectures (vision-language, mixture-of-experts, ...): they are left
out until the same checks run on them.
"""

from __future__ import annotations

from typing import Any

from tritonforge.export.errors import SpecError

# model_type -> architecture (the builder's dispatch key)
FAMILIES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
}

# The builder's KEY=VALUE options a family needs. Gemma 3: every layer keeps the whole cache
# (the builder's default gives sliding-window layers a bounded cache of their own shape, which
# the serving scheduler's one right-padded cache layout cannot batch); GroupQueryAttention's
# local window still drops the old columns in those layers.
BUILDER_OPTIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "gemma3_text": (("windowed_kv_cache", "false"),),
}

# Logits tolerance (atol, rtol) vs transformers where a family's fp32 graph differs by more than
# the spec's default (1e-2, 1e-3). Gemma 3 270M (18 layers, logits up to ~30, a large residual
# stream): max abs 0.039 and 0.098 in two runs of the grid, ~3e-3 relative to the logit; the
# cause (a kernel's accumulation order or the builder's embedding scale) is not isolated yet.
LOGITS_TOLERANCE: dict[str, tuple[float, float]] = {
    "gemma3_text": (5e-2, 5e-3),
}


def supported() -> str:
    """The supported families, for messages."""
    return ", ".join(f"{t} ({a})" for t, a in FAMILIES.items())


def family_of(config: Any, source: object) -> str:
    """``config``'s family (its ``model_type``); :class:`SpecError` naming the supported
    families when the builder cannot take it (``source`` names the checkpoint)."""
    model_type = str(getattr(config, "model_type", "") or "")
    if model_type not in FAMILIES:
        raise SpecError(
            f"{source}: model_type {model_type or '(none)'!r} is not a supported decoder family; "
            f"supported: {supported()}"
        )
    if model_type == "phi3":
        original = getattr(config, "original_max_position_embeddings", None)
        if original not in (None, config.max_position_embeddings):
            raise SpecError(
                f"{source}: Phi-3 with a long-context (LongRoPE) extension is not supported; "
                "use a checkpoint whose max_position_embeddings equals "
                "original_max_position_embeddings"
            )
    return model_type


def check_architecture(model: Any, family: str, source: object) -> None:
    """The loaded model is the family's ``*ForCausalLM`` (a text-only causal LM)."""
    want, got = FAMILIES[family], type(model).__name__
    if got != want:
        raise SpecError(
            f"{source}: transformers loaded a {got}, the {family} family exports a {want} "
            f"(supported: {supported()})"
        )
