"""The ``generate`` model's engine outside Triton: artifacts from a model version directory and
the config's parameters -> a running :class:`Scheduler` plus request building (prompt
rendering, tokenizing, limits). ``model.py`` only moves tensors in and out; the in-process
benchmark and the tests drive the same engine."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tritonforge.decoder import OrtDecoder
from tritonforge.errors import InvalidInputError, ModelConfigError
from tritonforge.generation import (
    cache_salt,
    check_variant,
    queue_priority,
    render_prompt,
    with_bos,
)
from tritonforge.integrity import verify_sidecar
from tritonforge.modelconfig import ModelConfig
from tritonforge.pipelines import VARIANT_KEY, VARIANT_PARAMETER
from tritonforge.prefill_plan import check_chunk_tokens, check_stall_row_tokens
from tritonforge.prefix_cache import check_bounds
from tritonforge.sampling import GenerationLimits, parse_sampling
from tritonforge.scheduler import ErrorFn, Generation, OutputFn, Scheduler, queue_rank
from tritonforge.speculation import MAX_NGRAM_KEY, MIN_NGRAM_KEY, TOKENS_KEY, PromptLookup
from tritonforge.text_stream import StreamInterval, TextStream

# the full-batch warm-up's tokens: enough decode steps that its prefill weighs little in the
# measured seconds per token (4 made the first forecast ~6x too long on a busy host)
WARMUP_FULL_TOKENS = 16


class GenerateEngine:
    """Load the model's decoder (``parameters.decoder_file``; the variant it is, fp32 or int8, is
    ``tritonforge.variant``), the tokenizer and the chat template (each checked against its
    sidecar), and own the scheduler."""

    def __init__(
        self,
        config: ModelConfig,
        version_dir: Path,
        on_step: Callable[[int, int], None] | None = None,
    ) -> None:
        from tokenizers import Tokenizer

        variant = config.param(VARIANT_KEY, "fp32")
        decoder_path = version_dir / config.param("decoder_file", kind=str)
        tokenizer_path = version_dir / config.param("tokenizer_file", kind=str)
        meta_path = version_dir / config.param("generation_file", kind=str)
        digests = [
            verify_sidecar(p, required=True) for p in (decoder_path, tokenizer_path, meta_path)
        ]
        self.name, self.variant = config.name, variant
        meta = json.loads(meta_path.read_text())
        self.chat_template: str | None = meta.get("chat_template")
        self.eos_ids: list[int] = list(meta["eos_token_ids"])
        # the bos the checkpoint's tokenizer puts first in every prompt (None: none)
        self.prompt_bos: int | None = meta.get("prompt_bos_token_id")
        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        # ONNX Runtime session entries from the config (``session.*`` parameters), as the
        # encoders' backend passes them.
        session = {k: v for k, v in config.parameters.items() if k.startswith("session.")}
        self.decoder = OrtDecoder(
            decoder_path, config.param("intra_op_threads", 1, int), session, digests[0]
        )
        self.limits = GenerationLimits(
            max_prompt_tokens=config.param("max_prompt_tokens", kind=int),
            max_new_tokens_limit=config.param("max_new_tokens_limit", kind=int),
            default_max_new_tokens=config.param("default_max_new_tokens", kind=int),
        )
        try:
            interval = StreamInterval(
                config.param("stream_interval_rows", 0, int),
                config.param("stream_interval_max_tokens", 1, int),
            )
            chunk_tokens = check_chunk_tokens(config.param("prefill_chunk_tokens", 0, int))
            stall_row_tokens = check_stall_row_tokens(
                config.param("prefill_stall_row_tokens", 0, int)  # absent: a fixed chunk
            )
            # absent (exported before it): no prefix cache, as then
            prefix_entries, prefix_tokens = check_bounds(
                config.param("prefix_cache_entries", 0, int),
                config.param("prefix_cache_tokens", 0, int),  # absent: the entries bound only
            )
            # absent (exported before it): no speculation, as then
            lookup = PromptLookup(
                config.param(TOKENS_KEY, 0, int),
                config.param(MIN_NGRAM_KEY, 3, int),
                config.param(MAX_NGRAM_KEY, 4, int),
            )
        except ValueError as e:  # absent (exported before it): one token per response, as then
            raise ModelConfigError(f"model {config.name!r}: parameters.{e}") from e
        self.scheduler = Scheduler(
            self.decoder,
            self.decoder.empty_past,
            self.eos_ids,
            max_running=config.param("max_running", kind=int),
            max_queue=config.param("max_queue", kind=int),
            name=config.name,
            queue_timeout_s=config.param("queue_timeout_s", kind=float),
            on_step=on_step,
            layout=self.decoder.layout,
            kv_headroom=self.decoder.kv_headroom,
            stream_interval=interval,
            prefill_chunk_tokens=chunk_tokens,  # absent (exported before it): whole prefills
            prefill_stall_row_tokens=stall_row_tokens,
            lookup=lookup,
            prefix_cache_entries=prefix_entries,
            prefix_cache_tokens=prefix_tokens,
        )
        self.seeds = np.random.SeedSequence()

    def prompt_ids(self, text: str, chat_template: bool) -> list[int]:
        """Token ids of the prompt; :class:`InvalidInputError` naming ``text_input`` when it is
        empty or longer than ``max_prompt_tokens``."""
        prompt = render_prompt(text, self.chat_template, chat_template)
        ids = with_bos(self.tokenizer.encode(prompt, add_special_tokens=False).ids, self.prompt_bos)
        if not ids:
            raise InvalidInputError("text_input: the prompt is empty")
        if len(ids) > self.limits.max_prompt_tokens:
            raise InvalidInputError(
                f"text_input: the prompt has {len(ids)} tokens, more than max_prompt_tokens "
                f"{self.limits.max_prompt_tokens}"
            )
        return ids

    def build(
        self,
        text: str,
        values: Mapping[str, Any],
        on_output: OutputFn,
        on_error: ErrorFn,
        is_cancelled: Any = lambda: False,
    ) -> Generation:
        self.check_variant(values.get(VARIANT_PARAMETER))
        params = parse_sampling(values, self.limits)
        seed = params.seed if params.seed is not None else self.seeds.spawn(1)[0]
        return Generation(
            self.prompt_ids(text, params.chat_template),
            params,
            TextStream(self.tokenizer, params.stop),
            on_output=on_output,
            on_error=on_error,
            is_cancelled=is_cancelled,
            rng=np.random.default_rng(seed),
            priority=queue_priority(values),
            cache_salt=cache_salt(values),
        )

    def check_admission(self, values: Mapping[str, Any]) -> None:
        """Refuse (:class:`StageUnavailableError`) a request the queue would refuse now, before
        it is built: under a flood a refusal then costs no chat template and no tokenization."""
        self.scheduler.check_admission(queue_rank(queue_priority(values)))

    def check_variant(self, requested: Any) -> None:
        """:class:`InvalidInputError` naming ``variant`` when a request pins another variant."""
        check_variant(requested, self.variant, self.name)

    def warmup(self, text: str) -> None:
        """Short generations on the calling thread (before :meth:`start`): one alone, then a
        full batch (``max_running``), so that the scheduler's queue forecast
        (:mod:`tritonforge.queue_forecast`) knows a full step's time before the first flood."""
        # never refused by its own forecast (a busy host's first prefill made it refuse the
        # full batch, and the model failed to load): what it measures is that forecast
        timeout_s, self.scheduler.queue_timeout_s = self.scheduler.queue_timeout_s, None
        try:
            for batch, max_tokens in ((1, 2), (self.scheduler.max_running, WARMUP_FULL_TOKENS)):
                for _ in range(batch):
                    seq = self.build(text, {"max_tokens": max_tokens}, *[lambda *_: None] * 2)
                    self.scheduler.submit(seq)
                self.scheduler.run_until_idle()
        finally:
            self.scheduler.queue_timeout_s = timeout_s
        self.scheduler.rate.forget_share()  # the warm-up's prompt stops early: not the traffic's

    def start(self) -> None:
        self.scheduler.start()

    def close(self) -> None:
        self.scheduler.close()
