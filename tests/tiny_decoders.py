"""Tiny random-initialised causal LMs of each supported family, saved with ``save_pretrained``
(no download): Llama, Mistral, Qwen2, Qwen3, Gemma 3 (``Gemma3ForCausalLM``, text only) and Phi-3. 2 layers,
hidden 64, grouped-query attention (4 heads, 2 KV heads, head dim 16).

They share a byte-level BPE tokenizer trained here on the project's generation prompts, with
``<s>`` (bos), ``</s>`` (eos) and ``<pad>``, and a small chat template (``chat=False`` leaves it
out: such a model serves completions only). Random weights give near-uniform logits; the
weights are scaled up (:func:`_sharpen`) so that greedy decoding has clear margins, as a trained
model does, and a fidelity divergence means a real difference rather than a numerical tie.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.tiny_checkpoints import CORPUS

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text", "phi3")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<|user|>", "<|assistant|>", "<|system|>"]
SIZES = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 2048,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}


def _corpus() -> list[str]:
    from tritonforge.tasks.generation.export import DATA_DIR

    lines = (DATA_DIR / "generation_prompts.txt").read_text().splitlines()
    return [*CORPUS, *(line for line in lines if line.strip())]


def tokenizer(chat: bool = True) -> Any:
    """A ``PreTrainedTokenizerFast`` (byte-level BPE, 512 tokens) that adds ``<s>`` first."""
    from tokenizers import ByteLevelBPETokenizer
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(_corpus(), vocab_size=512, min_frequency=1, special_tokens=SPECIALS)
    bpe.post_processor = TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        chat_template=CHAT_TEMPLATE if chat else None,
    )


def _config(family: str, vocab: int) -> Any:
    from transformers import (
        Gemma3TextConfig,
        LlamaConfig,
        MistralConfig,
        Phi3Config,
        Qwen2Config,
        Qwen3Config,
    )

    sizes = {**SIZES, "vocab_size": vocab}
    if family == "llama":
        return LlamaConfig(**sizes)
    if family == "mistral":
        return MistralConfig(**sizes)
    if family == "qwen2":
        return Qwen2Config(**sizes)
    if family == "qwen3":
        return Qwen3Config(**sizes)
    if family == "gemma3_text":
        # a sliding window shorter than the verification grid's sequences: local layers
        # really drop old columns (Gemma 3 alternates local and global attention)
        return Gemma3TextConfig(
            **sizes, sliding_window=32, layer_types=["sliding_attention", "full_attention"]
        )
    if family == "phi3":
        return Phi3Config(**sizes, original_max_position_embeddings=2048)
    raise ValueError(f"no tiny {family!r}; families: {FAMILIES}")


def _sharpen(model: Any, scale: float) -> None:
    """Scale the output head so that logits spread over several units (clear greedy margins)."""
    import torch

    with torch.no_grad():
        model.lm_head.weight.mul_(scale)


def decoder(directory: Path, family: str, chat: bool = True, seed: int = 0) -> Path:
    """A tiny ``family`` checkpoint with :func:`tokenizer` saved at ``directory``."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    tok = tokenizer(chat)
    model = AutoModelForCausalLM.from_config(_config(family, len(tok)), dtype=torch.float32)
    _sharpen(model.eval(), 8.0)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory
