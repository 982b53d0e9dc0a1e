"""Pair tokenization for a cross-encoder: (query, document) -> one padded batch.

``tokenizers`` encodes the pairs with the model's template (BERT: ``[CLS] q [SEP] d [SEP]``,
``token_type_ids`` 0 then 1), truncates each pair to ``max_length`` with the model's strategy and
pads the batch to its longest pair. ``longest_first`` (ms-marco-MiniLM's tokenizer.json and its
model card's ``truncation=True``) cuts the longer of the two, token by token, so a query longer
than the document's remainder is cut too; ``only_second`` cuts only the document and refuses a
query that leaves no room for it. Matches transformers' ``tokenizer(queries, documents,
truncation=..., max_length=..., padding=True)`` (tests/unit/test_rerank_pairs.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tritonforge.tasks.rerank.protocol import RerankRequestError
from tritonforge.text import TOKENIZER_OUTPUTS

TRUNCATION_STRATEGIES = ("longest_first", "only_second")
_FIELDS = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}
_STRATEGY_OF_JSON = {"LongestFirst": "longest_first", "OnlySecond": "only_second"}


def tokenizer_truncation(path: Path | str) -> tuple[str | None, int | None]:
    """``(strategy, max_length)`` stored in a tokenizer.json (None where it has none)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    truncation = data.get("truncation") or {}
    strategy = _STRATEGY_OF_JSON.get(str(truncation.get("strategy")))
    length = truncation.get("max_length")
    return strategy, int(length) if length is not None else None


class PairTokenizer:
    """A ``tokenizers`` pair encoder loaded once.

    ``truncation``: one of :data:`TRUNCATION_STRATEGIES`, default the tokenizer.json's
    (else ``longest_first``); ``max_length`` includes the special tokens. ``outputs``: the
    graph's input names, in order (a subset of ``input_ids``, ``attention_mask``,
    ``token_type_ids``); ``pad_id`` default the tokenizer.json's, else 0.
    """

    def __init__(
        self,
        path: Path | str,
        max_length: int,
        truncation: str | None = None,
        outputs: Sequence[str] = TOKENIZER_OUTPUTS,
        pad_id: int | None = None,
    ) -> None:
        from tokenizers import Tokenizer

        stored, _ = tokenizer_truncation(path)
        strategy = truncation or stored or "longest_first"
        if strategy not in TRUNCATION_STRATEGIES:
            raise ValueError(f"truncation {strategy!r} is not one of {TRUNCATION_STRATEGIES}")
        unknown = sorted(set(outputs) - set(_FIELDS))
        if unknown or not outputs:
            raise ValueError(f"outputs {list(outputs)}: use names from {list(_FIELDS)}")
        if max_length < 4:
            raise ValueError(
                f"max_length must be >= 4 (room for 3 special tokens), got {max_length}"
            )
        self.truncation = strategy
        self.max_length = max_length
        self.outputs = tuple(outputs)
        self._tokenizer = Tokenizer.from_file(str(path))
        padding = self._tokenizer.padding or {}
        self.pad_id = int(padding.get("pad_id", 0)) if pad_id is None else pad_id
        self._tokenizer.enable_truncation(max_length=max_length, strategy=strategy)
        self._tokenizer.enable_padding(
            pad_id=self.pad_id,
            pad_type_id=int(padding.get("pad_type_id", 0)),
            pad_token=str(padding.get("pad_token", "[PAD]")),
        )

    def encode(self, query: str, documents: Sequence[str]) -> dict[str, np.ndarray]:
        """One batch of ``len(documents)`` pairs: int64 ``[n, longest]`` per output name.

        With ``only_second``, a query too long to leave the document a token raises
        :class:`RerankRequestError` naming ``query``.
        """
        if not documents:
            raise RerankRequestError("documents", "is empty; send at least one document")
        try:
            encodings = self._tokenizer.encode_batch([(query, d) for d in documents])
        except Exception as e:  # tokenizers raises a bare Exception on a truncation error
            if "truncat" not in str(e).lower():
                raise
            raise RerankRequestError(
                "query",
                f"is too long to leave room for the document within {self.max_length} tokens "
                f"(truncation {self.truncation}); shorten it",
            ) from e
        return {
            name: np.array([getattr(e, _FIELDS[name]) for e in encodings], dtype=np.int64)
            for name in self.outputs
        }


def input_tokens(tokens: dict[str, np.ndarray], mask_name: str = "attention_mask") -> int:
    """The tokens a batch puts through the model (padding excluded): the usage figure."""
    return int(np.asarray(tokens[mask_name]).sum())
