"""Helpers for specs of text encoders: corpora from text files, tokenization, random token rows."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tritonforge.export.errors import SpecError
from tritonforge.export.spec import Inputs
from tritonforge.text import TextTokenizer

DATA_DIR = Path(__file__).resolve().parent.parent / "data"


def read_sentences(path: Path) -> list[str]:
    """Non-empty lines of ``path`` that are not ``#`` comments."""
    lines = (line.strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def disjoint_sentences(path: Path, held_out: Path) -> list[str]:
    """Sentences of ``path``; raise :class:`SpecError` if any also appears in ``held_out``."""
    sentences = read_sentences(path)
    shared = sorted(set(sentences) & set(read_sentences(held_out)))
    if shared:
        raise SpecError(
            f"{path.name} and {held_out.name} must be disjoint; shared: {shared[:3]} "
            f"({len(shared)} in all); remove them from one file"
        )
    return sentences


class TokenizerInputs:
    """Tokenize sentences into the encoder's inputs (padded to the longest row, truncated at
    ``max_length``) with the served models' tokenizer (:class:`tritonforge.text.TextTokenizer`),
    so calibration and evaluation see the ids the server computes; loaded once, on first use."""

    def __init__(self, tokenizer_file: Path, max_length: int) -> None:
        self.tokenizer_file = tokenizer_file
        self.max_length = max_length
        self._tokenizer: TextTokenizer | None = None

    def __call__(self, sentences: Sequence[str]) -> Inputs:
        if self._tokenizer is None:
            self._tokenizer = TextTokenizer(self.tokenizer_file, self.max_length)
        return self._tokenizer.encode(sentences)

    def batches(self, sentences: Sequence[str], batch_size: int) -> list[Inputs]:
        return [self(sentences[i : i + batch_size]) for i in range(0, len(sentences), batch_size)]


def random_token_rows(
    lengths: Sequence[int],
    rng: np.random.Generator,
    vocab_size: int,
    cls_id: int = 101,
    sep_id: int = 102,
    first_id: int = 1999,
) -> Inputs:
    """Rows ``[CLS] w... [SEP]`` of the given lengths, right-padded with 0 to the longest."""
    width = max(lengths)
    ids = np.zeros((len(lengths), width), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = rng.integers(first_id, vocab_size, size=n)
        ids[row, 0] = cls_id
        if n >= 2:
            ids[row, n - 1] = sep_id
        mask[row, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
