"""The default classifier's trainer (tasks/classification/export/training): data rules, split, exact CLS-only top,
baselines, and an end-to-end build on a tiny BERT and a tiny CSV (offline, under tmp_path)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, BertConfig

from tritonforge.export.errors import VerificationError
from tritonforge.tasks.classification.export.training import build as build_mod
from tritonforge.tasks.classification.export.training.base_model import (
    cls_head_logits,
    encode_frozen,
)
from tritonforge.tasks.classification.export.training.build import (
    REPORT_JSON,
    build,
    checkpoint_dir,
)
from tritonforge.tasks.classification.export.training.data import (
    LABELS,
    CorpusError,
    Row,
    clean_rows,
    clean_text,
    load_corpus,
    load_split,
    read_rows,
    split_rows,
)
from tritonforge.tasks.classification.export.training.evaluation import (
    majority_baseline,
    scores,
    tfidf_baseline,
)
from tritonforge.tasks.classification.export.training.train import HyperParams, native_bf16

TINY_HP = HyperParams(
    max_length=16,
    epochs=30,
    batch_size=4,
    learning_rate=3e-3,
    head_learning_rate=1e-2,
    threads=1,
    feature_dtype="float32",
    encode_batch_size=16,
)


def rows_of(labels: list[str]) -> list[Row]:
    return [Row(i, f"text {i}", lab) for i, lab in enumerate(labels)]


# --- data ---------------------------------------------------------------------------------------


def test_clean_text_removes_mojibake_and_entities() -> None:
    assert (
        clean_text("I don\xd5\xa2_\x8a\xce_\x86\xa2t  know &amp; care_\xd1_.")
        == "I don t know & care ."
    )
    assert clean_text("plain_snake_case stays") == "plain_snake_case stays"
    assert clean_text(" \xd1\xd1 ") == ""


def test_clean_rows_drops_empty_duplicates_and_conflicts() -> None:
    rows = [
        Row(0, "Good day", "positive"),
        Row(1, "  ", "neutral"),
        Row(2, "good   DAY", "positive"),  # duplicate of 0 once case-folded
        Row(3, "mixed", "positive"),
        Row(4, "Mixed", "negative"),  # conflicting labels: both dropped
        Row(5, "\xd1_", "neutral"),  # empty once the mojibake is removed
        Row(6, "bad day", "negative"),
    ]
    kept, stats = clean_rows(rows)
    assert [(r.row_id, r.text) for r in kept] == [(0, "Good day"), (6, "bad day")]
    assert (stats.empty_dropped, stats.duplicates_dropped, stats.conflicting_dropped) == (2, 1, 2)
    assert stats.rows_kept == 2 and stats.per_label == {"negative": 1, "positive": 1}


def test_read_rows_rejects_unknown_labels(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"sentiment,confidence,text\r\njoyful,1,hello\r\n")
    with pytest.raises(CorpusError, match="joyful"):
        read_rows(bad)
    bad.write_bytes(b"label,text\r\npositive,hello\r\n")
    with pytest.raises(CorpusError, match="sentiment"):
        read_rows(bad)


def test_split_is_stratified_seeded_and_disjoint() -> None:
    labels = ["negative"] * 500 + ["neutral"] * 300 + ["positive"] * 200
    rows = rows_of(labels)
    split = split_rows(rows)
    parts = [set(split.train), set(split.validation), set(split.test)]
    assert sum(map(len, parts)) == len(rows) and set().union(*parts) == set(range(len(rows)))
    assert not (parts[0] & parts[1] or parts[0] & parts[2] or parts[1] & parts[2])
    for ids, size in ((split.test, 100), (split.validation, 100), (split.train, 800)):
        counts = Counter(labels[i] for i in ids)
        assert len(ids) == size
        for lab, total in Counter(labels).items():
            assert abs(counts[lab] - total * size / len(rows)) <= 1, (lab, counts)
    half = Counter(labels[i] for i in split.train_half)
    assert set(split.train_half) <= parts[0] and len(split.train_half) == 400
    assert half == {"negative": 200, "neutral": 120, "positive": 80}
    assert split_rows(rows) == split
    assert split_rows(rows, seed=1).test != split.test


def test_load_split_reads_the_csv(tiny_corpus: Path) -> None:
    corpus = load_corpus(tiny_corpus)
    assert corpus.stats.rows_read == 96
    assert (corpus.stats.empty_dropped, corpus.stats.duplicates_dropped) == (1, 1)
    assert corpus.stats.conflicting_dropped == 2 and corpus.stats.texts_with_mojibake == 1
    texts, labels = load_split("test", tiny_corpus)
    assert len(texts) == len(labels) == len(corpus.split.test) and set(labels) <= set(LABELS)
    assert "good great & happy" in {r.text for r in corpus.rows}
    with pytest.raises(ValueError, match="unknown split"):
        load_split("dev", tiny_corpus)  # type: ignore[arg-type]


# --- model --------------------------------------------------------------------------------------


def test_cls_only_top_equals_the_full_model() -> None:
    from transformers import BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
        intermediate_size=64, num_labels=3, attn_implementation="sdpa",
    )  # fmt: skip
    model = BertForSequenceClassification(config).eval()
    ids = [[2, 5, 6, 7, 3], [2, 8, 3], [2, 9, 10, 11, 12, 13, 3]]
    feats = encode_frozen(model, ids, "float32", 2, torch.float32)
    with torch.inference_mode():
        ours = cls_head_logits(model, *feats.batch([0, 1, 2]))
        x = torch.tensor([i + [0] * (7 - len(i)) for i in ids])
        full = model(input_ids=x, attention_mask=(x != 0).long()).logits
    torch.testing.assert_close(ours, full, atol=1e-5, rtol=1e-5)
    assert torch.equal(feats.batch([1])[1][0, 3:], torch.zeros(0, 64))  # no padding beyond


def test_training_keeps_the_cached_parts_frozen(
    tmp_path: Path, tiny_corpus: Path, tiny_bert_dir: Path
) -> None:
    from safetensors.torch import load_file

    out = tmp_path / "classifier"
    run_build(out, tiny_corpus, tiny_bert_dir)
    base = load_file(tiny_bert_dir / "model.safetensors")
    trained = load_file(checkpoint_dir(out, 2) / "model.safetensors")
    last = "encoder.layer.1."
    for name, tensor in base.items():
        changed = not torch.equal(trained[f"bert.{name}"], tensor)
        frozen = (
            not name.startswith(last)
            or ".attention.self.key." in name
            or ".attention.self.value." in name
        )
        assert changed != frozen or name.endswith(("pooler.dense.weight", "pooler.dense.bias")), (
            name
        )
    assert not torch.equal(
        trained[f"bert.{last}attention.self.query.weight"],
        base[f"{last}attention.self.query.weight"],
    )


# --- metrics and baselines ------------------------------------------------------------------------


def test_scores_and_baselines() -> None:
    s = scores([0, 0, 1, 2], [0, 1, 1, 2])
    assert s["accuracy"] == 0.75 and s["confusion_matrix"] == [[1, 1, 0], [0, 1, 0], [0, 0, 1]]
    assert s["f1_per_class"] == {
        "negative": pytest.approx(0.6667),
        "neutral": pytest.approx(0.6667),
        "positive": 1.0,
    }
    assert majority_baseline([2, 1, 1, 0], 3).tolist() == [1, 1, 1]
    words = {0: "awful bad", 1: "table road", 2: "great good"}
    train = [f"{words[i % 3]} x{i}" for i in range(60)]
    pred = tfidf_baseline(train, [i % 3 for i in range(60)], ["bad awful", "good", "road table"])
    assert pred.tolist() == [0, 2, 1]


# --- the build ----------------------------------------------------------------------------------


def run_build(out: Path, corpus: Path, base: Path, **kwargs: object) -> dict:
    logs: list[str] = []
    report = build(out, TINY_HP, corpus_file=corpus, base_dir=base, log=logs.append, **kwargs)  # type: ignore[arg-type]
    report["_log"] = logs
    return report


def test_build_saves_loadable_checkpoints(
    tmp_path: Path, tiny_corpus: Path, tiny_bert_dir: Path
) -> None:
    out = tmp_path / "classifier"
    report = run_build(out, tiny_corpus, tiny_bert_dir)
    texts, labels = load_split("test", tiny_corpus)
    for version in (1, 2):
        path = checkpoint_dir(out, version)
        assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
            p.name for p in path.iterdir()
        }
        model = AutoModelForSequenceClassification.from_pretrained(path).eval()
        assert model.config.id2label == {0: "negative", 1: "neutral", 2: "positive"}
        assert model.config.label2id == {"negative": 0, "neutral": 1, "positive": 2}
        tok = AutoTokenizer.from_pretrained(path)
        batch = tok(texts, truncation=True, max_length=16, padding=True, return_tensors="pt")
        with torch.inference_mode():
            pred = model(**batch).logits.argmax(-1).tolist()
        v = report["versions"][str(version)]
        assert scores([LABELS.index(lab) for lab in labels], pred) == v["test"]
        assert v["test"]["accuracy"] > v["baselines"]["majority"]["accuracy"]
    assert report["versions"]["1"]["train_count"] * 2 == pytest.approx(
        report["versions"]["2"]["train_count"], abs=1
    )
    saved = json.loads((out / REPORT_JSON).read_text())
    assert saved["split"]["counts"]["test"]["total"] == len(texts)
    assert sorted(saved["split"]["row_ids"]["test"]) == saved["split"]["row_ids"]["test"]
    assert (out / "training_report.md").read_text().startswith("# Default classifier")
    assert not list(tmp_path.glob(".classifier-staging-*"))


def test_build_is_deterministic_and_skipped_when_up_to_date(
    tmp_path: Path, tiny_corpus: Path, tiny_bert_dir: Path
) -> None:
    out = tmp_path / "classifier"
    first = run_build(out, tiny_corpus, tiny_bert_dir)
    weights = checkpoint_dir(out, 2) / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    again = run_build(out, tiny_corpus, tiny_bert_dir)
    assert (
        any("up to date" in line for line in again["_log"]) and weights.stat().st_mtime_ns == mtime
    )
    forced = run_build(out, tiny_corpus, tiny_bert_dir, force=True)
    assert forced["versions"]["2"]["files"] == first["versions"]["2"]["files"]  # same bytes
    assert forced["versions"]["1"]["files"] == first["versions"]["1"]["files"]
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")  # tampered: rebuilt
    rebuilt = run_build(out, tiny_corpus, tiny_bert_dir)
    assert any("recorded sha256" in line for line in rebuilt["_log"])
    assert rebuilt["versions"]["2"]["files"] == first["versions"]["2"]["files"]


def test_a_changed_input_rebuilds(tmp_path: Path, tiny_corpus: Path, tiny_bert_dir: Path) -> None:
    out = tmp_path / "classifier"
    run_build(out, tiny_corpus, tiny_bert_dir)
    tiny_corpus.write_bytes(tiny_corpus.read_bytes() + b"neutral,1,one more road\r\n")
    report = run_build(out, tiny_corpus, tiny_bert_dir)
    assert any("inputs changed" in line for line in report["_log"])


def test_a_failed_build_leaves_the_previous_output(
    tmp_path: Path, tiny_corpus: Path, tiny_bert_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "classifier"
    run_build(out, tiny_corpus, tiny_bert_dir)
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    monkeypatch.setattr(build_mod, "_verify_checkpoint", lambda *a, **k: ["reloaded logits differ"])
    with pytest.raises(VerificationError, match="reloaded logits differ"):
        run_build(out, tiny_corpus, tiny_bert_dir, force=True)
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before
    assert not list(tmp_path.glob(".classifier-staging-*"))


def test_verification_catches_a_wrong_checkpoint(
    tmp_path: Path, tiny_corpus: Path, tiny_bert_dir: Path
) -> None:
    out = tmp_path / "classifier"
    run_build(out, tiny_corpus, tiny_bert_dir)
    texts, _ = load_split("test", tiny_corpus)
    wrong = np.zeros((len(texts[:4]), 3), dtype=np.float32)
    failures = build_mod._verify_checkpoint(checkpoint_dir(out, 1), texts[:4], wrong, TINY_HP)
    assert failures and "differ" in failures[0]


def test_checkpoint_dir_names_the_versions(tmp_path: Path) -> None:
    assert checkpoint_dir(tmp_path, 1) == tmp_path / "v1"
    with pytest.raises(ValueError, match="unknown classifier version 3"):
        checkpoint_dir(tmp_path, 3)


def test_the_code_digest_does_not_follow_the_package_location(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A moved trainer (its imports name the new package) keeps its fingerprint: no retraining;
    any other change to its code counts."""
    own = build_mod.__name__.rpartition(".")[0]
    before = build_mod.code_digest()
    moved = tmp_path / "moved"
    moved.mkdir()
    for path in build_mod.CODE_ROOT.glob("*.py"):
        (moved / path.name).write_text(path.read_text().replace(own, "elsewhere.trainer"))
    monkeypatch.setattr(build_mod, "CODE_ROOT", moved)
    monkeypatch.setattr(build_mod, "__name__", "elsewhere.trainer.build")
    assert build_mod.code_digest() == before
    (moved / "train.py").write_text((moved / "train.py").read_text() + "\n# changed\n")
    assert build_mod.code_digest() != before


@pytest.mark.parametrize(
    ("flags", "native"),
    [
        ("fpu sse avx2 fma", False),  # AVX2 only (AMD EPYC Rome): bf16 autocast is emulated
        ("fpu avx512f avx512_vnni", False),
        ("fpu avx512f avx512_bf16", True),
        ("fpu avx512f amx_tile amx_bf16 amx_int8", True),
    ],
)
def test_native_bf16_reads_the_cpu_flags(tmp_path: Path, flags: str, native: bool) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: x\nflags\t\t: {flags}\n\n")
    assert native_bf16.__wrapped__(cpuinfo) is native


def test_native_bf16_is_false_without_cpuinfo(tmp_path: Path) -> None:
    assert native_bf16.__wrapped__(tmp_path / "missing") is False


def test_the_default_feature_dtype_follows_the_cpu() -> None:
    assert HyperParams().feature_dtype == ("bfloat16" if native_bf16() else "float32")


def test_a_second_build_of_the_same_output_waits_for_the_first(
    tmp_path: Path, tiny_corpus: Path, tiny_bert_dir: Path
) -> None:
    """``make run`` trains beside the other exports while the sentiment export may ask for the
    same build: the second waits on ``.classifier.lock`` (instead of training again and deleting
    the first's staging directory), then finds the output up to date."""
    import fcntl
    import threading

    out = tmp_path / "classifier"
    logs: list[str] = []
    with open(tmp_path / ".classifier.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # a first build in progress
        worker = threading.Thread(
            target=build,
            args=(out, TINY_HP),
            kwargs={"corpus_file": tiny_corpus, "base_dir": tiny_bert_dir, "log": logs.append},
        )
        worker.start()
        for _ in range(600):
            if any("waiting for it" in line for line in logs):
                break
            threading.Event().wait(0.05)
        assert any("being built by another process" in line for line in logs), logs
        assert not out.exists() and worker.is_alive()
    worker.join(300)
    assert (checkpoint_dir(out, 2) / "model.safetensors").is_file()
