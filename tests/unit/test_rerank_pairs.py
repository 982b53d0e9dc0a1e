"""Pair tokenization against transformers' tokenizer on the same tokenizer.json (no mock)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tritonforge.tasks.rerank.export import package_dir
from tritonforge.tasks.rerank.pairs import PairTokenizer, input_tokens, tokenizer_truncation
from tritonforge.tasks.rerank.protocol import RerankRequestError
from tritonforge.tasks.rerank.spec import MS_MARCO_MINILM

QUERY = "How many people live in Berlin, the capital of Germany?"
DOCUMENTS = [
    "Berlin has a population of 3,520,031 registered inhabitants in an area of 891.82 km². " * 12,
    "short",
    "Ünïcödé, emoji 🚀 and CJK 柏林 are tokenized too.",
    "New York City is famous for the Metropolitan Museum of Art.",
]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return package_dir(MS_MARCO_MINILM)


@pytest.fixture(scope="module")
def hf_tokenizer(model_dir: Path) -> object:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def test_the_models_truncation_is_read_from_its_tokenizer(model_dir: Path) -> None:
    assert tokenizer_truncation(model_dir / "tokenizer.json") == ("longest_first", 512)
    tokenizer = PairTokenizer(model_dir / "tokenizer.json", MS_MARCO_MINILM.max_length)
    assert tokenizer.truncation == "longest_first"


@pytest.mark.parametrize("strategy", ["longest_first", "only_second"])
@pytest.mark.parametrize("max_length", [24, 64, 512])
@pytest.mark.parametrize("query", [QUERY, QUERY + " and what about its suburbs? " * 3])
def test_pairs_equal_transformers(
    model_dir: Path, hf_tokenizer: object, strategy: str, max_length: int, query: str
) -> None:
    tokenizer = PairTokenizer(model_dir / "tokenizer.json", max_length, strategy)
    try:
        theirs = hf_tokenizer(  # type: ignore[operator]
            [query] * len(DOCUMENTS),
            DOCUMENTS,
            truncation=strategy,
            max_length=max_length,
            padding=True,
            return_tensors="np",
        )
    except Exception:  # only_second: a query leaving the document no room; we refuse it too
        with pytest.raises(RerankRequestError):
            tokenizer.encode(query, DOCUMENTS)
        assert strategy == "only_second"
        return
    ours = tokenizer.encode(query, DOCUMENTS)
    assert set(ours) == {"input_ids", "attention_mask", "token_type_ids"}
    for name, value in ours.items():
        assert value.dtype == np.int64
        np.testing.assert_array_equal(value, theirs[name], err_msg=name)
    assert ours["input_ids"].shape[1] <= max_length
    # the document is the second segment: token_type_ids 1 after the query's [SEP]
    assert ours["token_type_ids"][1].max() == 1


def test_longest_first_cuts_a_long_query_too(model_dir: Path) -> None:
    long_query = "berlin " * 40
    tokens = PairTokenizer(model_dir / "tokenizer.json", 24, "longest_first").encode(
        long_query, ["short"]
    )
    segment_a = int((tokens["token_type_ids"][0] == 0).sum())
    assert tokens["input_ids"].shape == (1, 24) and segment_a < 40


def test_only_second_refuses_a_query_leaving_no_room(model_dir: Path) -> None:
    tokenizer = PairTokenizer(model_dir / "tokenizer.json", 24, "only_second")
    with pytest.raises(RerankRequestError) as caught:
        tokenizer.encode("berlin " * 40, ["short"])
    assert caught.value.field == "query"


def test_outputs_follow_the_graphs_inputs_and_usage_counts_real_tokens(model_dir: Path) -> None:
    tokenizer = PairTokenizer(
        model_dir / "tokenizer.json", 512, outputs=("input_ids", "attention_mask")
    )
    tokens = tokenizer.encode("q", ["a b", "a"])
    assert list(tokens) == ["input_ids", "attention_mask"]
    # [CLS] q [SEP] a b [SEP] = 6 and [CLS] q [SEP] a [SEP] = 5 (padded to 6)
    assert tokens["input_ids"].shape == (2, 6) and input_tokens(tokens) == 11


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"truncation": "only_first"}, "truncation"),
        ({"outputs": ("pixel_values",)}, "outputs"),
        ({"max_length": 3}, "max_length"),
    ],
)
def test_bad_settings_are_refused(model_dir: Path, kwargs: dict[str, object], match: str) -> None:
    settings: dict[str, object] = {"max_length": 512, **kwargs}
    with pytest.raises(ValueError, match=match):
        PairTokenizer(model_dir / "tokenizer.json", **settings)  # type: ignore[arg-type]


def test_no_documents_is_refused(model_dir: Path) -> None:
    with pytest.raises(RerankRequestError) as caught:
        PairTokenizer(model_dir / "tokenizer.json", 512).encode("q", [])
    assert caught.value.field == "documents"
