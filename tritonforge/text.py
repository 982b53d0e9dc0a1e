"""The text pipeline as plain functions: validate, tokenize, split, pool, normalise, compare.

The ``tokenizer`` and ``embed_bls`` Triton models are thin loops around these;
unit tests call them directly. Only numpy and ``tokenizers`` are needed.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tritonforge.errors import InvalidInputError, NumericalError

TOKENIZER_OUTPUTS = ("input_ids", "attention_mask", "token_type_ids")
"""What :meth:`TextTokenizer.encode` returns by default, in this order (BERT's input names)."""
_ENCODING_FIELDS = {
    "input_ids": "ids",
    "attention_mask": "attention_mask",
    "token_type_ids": "type_ids",
}


@dataclass(frozen=True)
class TextLimits:
    """Caller-facing limits on one request: at most ``max_items`` texts of ``max_text_bytes``."""

    max_items: int = 64
    max_text_bytes: int = 16384


_ALLOWED_CONTROLS = frozenset("\t\n\r")


def check_content(text: str, field: str, index: int) -> None:
    """Refuse control characters (other than tab/newline/CR) and text with nothing to embed: no
    letter, digit, punctuation or symbol (only format characters such as U+200B, or separators).
    Such texts all tokenize to the same empty sequence and would get one identical vector."""
    for offset, char in enumerate(text):
        if unicodedata.category(char) == "Cc" and char not in _ALLOWED_CONTROLS:
            raise InvalidInputError(
                f"input {field!r} item {index} has control character U+{ord(char):04X} at "
                f"offset {offset}; send plain text"
            )
    if not any(unicodedata.category(c)[0] in "LNPS" for c in text):
        raise InvalidInputError(
            f"input {field!r} item {index} has no letter, digit, punctuation or symbol "
            "(only invisible or separator characters); send real text"
        )


def decode_texts(values: Any, field: str, limits: TextLimits) -> list[str]:
    """Decode one request's BYTES tensor (any shape, e.g. ``[batch, 1]``) into validated strings.

    Raises :class:`InvalidInputError` naming ``field`` and the item index for an empty batch,
    too many items, non-UTF-8, too long (in UTF-8 bytes) or empty/whitespace-only text.
    """
    items = np.asarray(values, dtype=object).reshape(-1)
    if items.size == 0:
        raise InvalidInputError(f"input {field!r} is an empty batch; send at least one text")
    if items.size > limits.max_items:
        raise InvalidInputError(
            f"input {field!r} has {items.size} items; at most {limits.max_items} are allowed "
            "per request (split the batch)"
        )
    texts: list[str] = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            raw = item.encode("utf-8")
        elif isinstance(item, bytes | bytearray | np.bytes_):
            raw = bytes(item)
        else:
            raise InvalidInputError(
                f"input {field!r} item {i} is {type(item).__name__}, expected UTF-8 bytes"
            )
        if len(raw) > limits.max_text_bytes:
            raise InvalidInputError(
                f"input {field!r} item {i} is {len(raw)} bytes; at most "
                f"{limits.max_text_bytes} UTF-8 bytes are allowed"
            )
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidInputError(
                f"input {field!r} item {i} is not valid UTF-8 (byte {e.start}); send UTF-8 text"
            ) from e
        if not text.strip():
            raise InvalidInputError(
                f"input {field!r} item {i} is empty or whitespace-only; send non-blank text"
            )
        check_content(text, field, i)
        texts.append(text)
    return texts


class TextTokenizer:
    """A ``tokenizers`` tokenizer loaded once: truncation to ``max_length``, pad to the longest.

    The padding/truncation stored in tokenizer.json (fixed 128 for all-MiniLM-L6-v2) is replaced;
    ``pad_id`` (default: tokenizer.json's, else 0) must be the model's pad token (RoBERTa: 1).
    ``outputs``: the model's input names, in order (DistilBERT and RoBERTa take no
    ``token_type_ids``).
    """

    def __init__(
        self,
        path: Path | str,
        max_length: int,
        pad_to_multiple_of: int = 1,
        outputs: Sequence[str] = TOKENIZER_OUTPUTS,
        pad_id: int | None = None,
    ) -> None:
        from tokenizers import Tokenizer

        unknown = sorted(set(outputs) - set(_ENCODING_FIELDS))
        if unknown or not outputs:
            raise ValueError(f"outputs {list(outputs)}: use names from {list(_ENCODING_FIELDS)}")
        self.outputs = tuple(outputs)

        if max_length < 2:
            raise ValueError(f"max_length must be >= 2 (room for [CLS]/[SEP]), got {max_length}")
        if pad_to_multiple_of < 1 or max_length % pad_to_multiple_of:
            raise ValueError(
                f"pad_to_multiple_of ({pad_to_multiple_of}) must be >= 1 and divide max_length "
                f"({max_length})"
            )
        self.max_length = max_length
        self.pad_to_multiple_of = pad_to_multiple_of
        self._tokenizer = Tokenizer.from_file(str(path))
        padding = self._tokenizer.padding or {}
        self._tokenizer.enable_truncation(max_length=max_length)
        self._tokenizer.enable_padding(
            pad_id=int(padding.get("pad_id", 0)) if pad_id is None else pad_id,
            pad_type_id=int(padding.get("pad_type_id", 0)),
            pad_token=str(padding.get("pad_token", "[PAD]")),
            pad_to_multiple_of=pad_to_multiple_of if pad_to_multiple_of > 1 else None,
        )

    @property
    def tokenizer(self) -> Any:
        """The underlying ``tokenizers.Tokenizer`` (``/tokenize`` spells texts with it)."""
        return self._tokenizer

    def lengths(self, texts: Sequence[str]) -> list[int]:
        """Each text's token count after truncation (its padding not counted)."""
        return [sum(e.attention_mask) for e in self._tokenizer.encode_batch(list(texts))]

    def encode_by_length(
        self, texts: Sequence[str], batch: int
    ) -> tuple[list[int], list[dict[str, np.ndarray]]]:
        """``(order, batches)``: ``texts`` tokenized in batches of ``batch`` rows of similar
        length (:func:`length_sorted_batches`), ``order`` the index into ``texts`` of each row of
        the batches laid end to end. Padding each batch to its longest then costs little."""
        groups = length_sorted_batches(self.lengths(texts), batch)
        return (
            [i for g in groups for i in g],
            [self.encode([texts[i] for i in g]) for g in groups],
        )

    def encode(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """Tokenize ``texts`` as one batch: int64 ``[len(texts), longest]`` per output name."""
        if not texts:
            raise InvalidInputError("nothing to tokenize: the batch is empty")
        encodings = self._tokenizer.encode_batch(list(texts))
        return {
            name: np.array([getattr(e, _ENCODING_FIELDS[name]) for e in encodings], dtype=np.int64)
            for name in self.outputs
        }


def length_sorted_batches(lengths: Sequence[int], batch: int) -> list[list[int]]:
    """Indices of ``lengths`` ordered by length (ties: by index, so the order is deterministic),
    cut into batches of ``batch``: each batch holds rows of similar length."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    return [order[i : i + batch] for i in range(0, len(order), batch)]


def split_tokens(
    tokens: dict[str, np.ndarray],
    counts: Sequence[int],
    mask_name: str = "attention_mask",
    pad_to_multiple_of: int = 1,
) -> list[dict[str, np.ndarray]]:
    """Cut a batch tokenized together back into per-request parts of ``counts`` rows each.

    Each part is trimmed to its own longest sequence (the max of its rows' mask sums) rounded up
    to ``pad_to_multiple_of``, so a request's tensors do not depend on what it was batched with.
    Rounding puts requests of similar length into the same shape, which Triton's dynamic batcher
    needs to batch them for the encoder (it only batches equal shapes); the padding is masked.
    """
    total = sum(counts)
    mask = tokens[mask_name]
    if mask.shape[0] != total:
        raise ValueError(f"{total} rows expected, the batch has {mask.shape[0]}")
    parts: list[dict[str, np.ndarray]] = []
    start = 0
    for count in counts:
        stop = start + count
        length = int(mask[start:stop].sum(axis=1).max()) if count else 0
        length = min(-(-length // pad_to_multiple_of) * pad_to_multiple_of, mask.shape[1])
        parts.append(
            {name: np.ascontiguousarray(arr[start:stop, :length]) for name, arr in tokens.items()}
        )
        start = stop
    return parts


def mean_pool(hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """Attention-mask mean of ``hidden`` ``[batch, seq, dim]`` over ``seq`` -> ``[batch, dim]``."""
    mask = attention_mask.astype(hidden.dtype)[..., None]
    summed = (hidden * mask).sum(axis=1)
    counts = np.clip(mask.sum(axis=1), 1e-9, None)
    return np.asarray(summed / counts, dtype=hidden.dtype)


def l2_normalize_rows(x: np.ndarray, eps: float = 1e-12) -> tuple[np.ndarray, np.ndarray]:
    """Unit-L2 rows of ``[batch, dim]`` and a boolean mask of rows that were not finite.

    Non-finite rows come back as NaN; zero rows stay zero (as ``torch.nn.functional.normalize``).
    """
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"expected [batch, dim], got shape {list(x.shape)}")
    bad = ~np.isfinite(x).all(axis=1)
    norms = np.linalg.norm(np.where(bad[:, None], 0.0, x), axis=1, keepdims=True)
    out = (x / np.maximum(norms, eps)).astype(np.float32)
    out[bad] = np.nan
    return out, bad


def l2_normalize(x: np.ndarray, field: str = "sentence_embedding") -> np.ndarray:
    """Unit-L2 rows; raise :class:`NumericalError` naming ``field`` and the first bad row."""
    out, bad = l2_normalize_rows(x)
    if bad.any():
        raise NumericalError(
            f"{field!r} row {int(np.argmax(bad))} is not finite (NaN/Inf from the encoder); "
            "check the exported model"
        )
    return out


def cosine_matrix(a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """Pairwise cosine similarity ``[len(a), len(b)]`` (``b`` defaults to ``a``)."""
    na = l2_normalize(a, "a")
    nb = na if b is None else l2_normalize(b, "b")
    return np.asarray(na @ nb.T, dtype=np.float32)


def rowwise_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of ``a`` with the same row of ``b``."""
    return np.asarray((l2_normalize(a, "a") * l2_normalize(b, "b")).sum(axis=1))


def nearest_neighbours(similarity: np.ndarray, k: int = 1) -> list[list[int]]:
    """Per row of a square similarity matrix, the ``k`` most similar *other* indices."""
    sim = np.array(similarity, dtype=np.float64, copy=True)
    np.fill_diagonal(sim, -np.inf)
    order = np.argsort(-sim, axis=1, kind="stable")[:, :k]
    return [[int(j) for j in row] for row in order]


def served_tokenizer(
    model_dir: Path, version: str = "1", pad_to_multiple_of: int = 1
) -> TextTokenizer:
    """The tokenizer of the served tokenizer model at ``model_dir``, configured from its
    ``config.pbtxt`` (``tokenizer_file``, ``max_length``), so that code outside Triton (the
    in-process bench, the FastAPI baseline) turns a text into the same ids as the server.
    Rows pad to the longest (rounded up to ``pad_to_multiple_of``: 1 by default, not the model's
    bucket, as a user's own loop would pad)."""
    from tritonforge.modelconfig import ModelConfig

    config = ModelConfig.from_pbtxt((model_dir / "config.pbtxt").read_text())
    return TextTokenizer(
        model_dir / version / config.param("tokenizer_file", kind=str),
        config.param("max_length", kind=int),
        pad_to_multiple_of,
        outputs=[t.name for t in config.outputs],
        pad_id=config.param("pad_id", 0, int),
    )
