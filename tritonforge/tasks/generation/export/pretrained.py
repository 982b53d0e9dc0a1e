"""A :class:`DecoderSpec` for any supported causal LM on disk (the bring-your-own-decoder path):
``tritonforge export --from-pretrained DIR | --gguf FILE --task generation --name NAME``.

Everything model-specific comes from the checkpoint (family, layers, heads, vocabulary, bos/eos,
rotary settings, chat template); the verification is the one every decoder gets (logits on the
grid, greedy fidelity, batch invariance, the int8 gate). The served names are ``NAME`` (the
fastest variant through its gate) and ``NAME_fp32``.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from tritonforge.export.errors import SpecError
from tritonforge.tasks.generation.export import DATA_DIR
from tritonforge.tasks.generation.export.families import LOGITS_TOLERANCE, family_of
from tritonforge.tasks.generation.export.load import read_config
from tritonforge.tasks.generation.export.spec import DecoderSpec, GenerationServing

# (batch, past, new): past 0 (prefill) and decode (new 1) at several past lengths.
GRID = tuple((b, p, s) for b in (1, 3) for p in (0, 1, 17, 70) for s in (1, 5))
PADDED = ((3, 11, 7), (1, 24), (9, 9, 2, 16))
NAME_PATTERN = r"[a-z][a-z0-9_]*"


def check_name(name: str) -> str:
    """``name`` as a served model name: lowercase letters, digits and _ (a Triton model
    directory and an OpenAI model id)."""
    if not re.fullmatch(NAME_PATTERN, name or ""):
        raise SpecError(f"--name {name!r}: use lowercase letters, digits and _ ({NAME_PATTERN})")
    return name


def decoder_from_pretrained(source: Path, name: str, **fields: object) -> DecoderSpec:
    """The spec of the decoder at ``source`` (a Hugging Face directory or a ``.gguf`` file),
    served as ``name``; :class:`SpecError` naming the supported families when the builder cannot
    take its family (read from the config alone, before any weight is loaded). ``fields``
    override :class:`DecoderSpec` fields (tests shorten the fidelity run)."""
    source = Path(source)
    name = check_name(name)
    config = read_config(source)
    family = family_of(config, source)
    context = int(getattr(config, "max_position_embeddings", 0) or 0)
    if context < 64:
        raise SpecError(f"{source}: max_position_embeddings {context} is too short to serve")
    defaults = GenerationServing()
    serving = GenerationServing(
        model_name=name,
        max_prompt_tokens=min(defaults.max_prompt_tokens, context // 2),
        max_new_tokens_limit=min(defaults.max_new_tokens_limit, context // 2),
        default_max_new_tokens=min(defaults.default_max_new_tokens, context // 4),
    )
    atol, rtol = LOGITS_TOLERANCE.get(family, (DecoderSpec.logits_atol, DecoderSpec.logits_rtol))
    spec = DecoderSpec(
        name=name,
        logits_atol=atol,
        logits_rtol=rtol,
        description=f"{family} decoder from {source.name}",
        source=source.resolve(),
        grid=GRID,
        padded_batches=PADDED,
        prompts_file=DATA_DIR / "generation_prompts.txt",
        perplexity_file=DATA_DIR / "perplexity.txt",
        questions_file=DATA_DIR / "factual_questions.tsv",
        serving=serving,
    )
    return replace(spec, **fields)  # type: ignore[arg-type]
