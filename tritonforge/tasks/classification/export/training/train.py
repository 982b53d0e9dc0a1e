"""Training the top of the classifier on cached frozen features, and evaluating it."""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import BertForSequenceClassification

from tritonforge.tasks.classification.export.training.base_model import (
    Features,
    _autocast,
    cls_head_logits,
    length_batches,
    trainable_parameters,
)
from tritonforge.tasks.classification.export.training.evaluation import LabelIds

NATIVE_BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})


@functools.cache
def native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """True when the CPU computes bfloat16 natively (AMX-BF16 or AVX512-BF16). Elsewhere (e.g. an
    AVX2-only AMD EPYC) autocast to bfloat16 is emulated and measured 7x *slower* than float32."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return False
    flags = next(
        (ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []
    )
    return bool(NATIVE_BF16_FLAGS & set(flags))


def default_feature_dtype() -> str:
    """bfloat16 where the CPU has it natively (fast, AMX), else float32."""
    return "bfloat16" if native_bf16() else "float32"


@dataclass(frozen=True)
class HyperParams:
    """Everything training depends on besides the data and the base model (all fingerprinted)."""

    max_length: int = 64  # tokens, [CLS] and [SEP] included: 99.9 % of the cleaned texts fit
    epochs: int = 3
    batch_size: int = 32
    learning_rate: float = 1e-4
    head_learning_rate: float = 1e-3  # pooler + classifier (freshly initialised)
    weight_decay: float = 0.01
    warmup_fraction: float = 0.06
    bucket_batches: int = 50  # batches drawn together and sorted by length (less padding)
    seed: int = 0
    threads: int = 2  # fixed: the float reductions, hence the bytes, depend on it
    # autocast of the frozen pass and of training: bfloat16 on CPUs with native bf16 (AMX), else
    # float32. Fingerprinted, so a checkpoint built on one kind of CPU is rebuilt on the other.
    feature_dtype: str = field(default_factory=default_feature_dtype)
    encode_batch_size: int = 128

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def epoch_batches(
    lengths: np.ndarray, hp: HyperParams, rng: np.random.Generator
) -> list[list[int]]:
    """Shuffled batches of rows of similar length: a seeded permutation, cut into buckets of
    ``bucket_batches`` batches, each bucket sorted by length, batches shuffled again."""
    perm = rng.permutation(len(lengths))
    size = hp.batch_size * hp.bucket_batches
    batches: list[list[int]] = []
    for start in range(0, len(perm), size):
        bucket = perm[start : start + size]
        for rows in length_batches(lengths[bucket], hp.batch_size):
            batches.append(bucket[rows].tolist())
    order = rng.permutation(len(batches))
    return [batches[i] for i in order]


@torch.inference_mode()
def predict_logits(
    model: BertForSequenceClassification,
    feats: Features,
    dtype: str = "float32",
    batch_size: int = 256,
) -> np.ndarray:
    """``[rows, labels]`` logits of the model's top on cached features, in row order."""
    model.eval()
    out = np.zeros((len(feats), int(model.config.num_labels or 0)), dtype=np.float32)
    with _autocast(dtype):
        for rows in length_batches(feats.lengths, batch_size):
            out[rows] = cls_head_logits(model, *feats.batch(rows)).float().numpy()
    return out


@dataclass
class TrainResult:
    best_epoch: int
    history: list[dict[str, float]]
    seconds: float


def train_top(
    model: BertForSequenceClassification,
    train: Features,
    train_labels: LabelIds,
    validation: Features,
    validation_labels: LabelIds,
    hp: HyperParams,
    log: Callable[[str], None] = print,
) -> TrainResult:
    """Train the last layer (at [CLS]) + pooler + classifier in place (AdamW, linear warmup and decay); keep
    the epoch with the best validation accuracy. Deterministic for a given ``hp``."""
    start = time.perf_counter()
    torch.manual_seed(hp.seed)
    rng = np.random.default_rng(hp.seed)
    params = trainable_parameters(model)
    pooler: Any = model.bert.pooler
    head = {id(p) for m in (pooler, model.classifier) for p in m.parameters()}
    groups = [
        {"params": [p for p in params if id(p) not in head], "lr": hp.learning_rate},
        {"params": [p for p in params if id(p) in head], "lr": hp.head_learning_rate},
    ]
    optimizer = torch.optim.AdamW([g for g in groups if g["params"]], weight_decay=hp.weight_decay)
    steps = hp.epochs * int(np.ceil(len(train) / hp.batch_size))
    warmup = max(1, int(hp.warmup_fraction * steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, max(0.0, (steps - s) / (steps - warmup)))
    )
    y = torch.tensor(list(train_labels), dtype=torch.long)
    y_val = np.asarray(validation_labels)
    history: list[dict[str, float]] = []
    best: tuple[float, int, dict[str, torch.Tensor]] | None = None
    for epoch in range(1, hp.epochs + 1):
        model.train()
        total, count = 0.0, 0
        for rows in epoch_batches(train.lengths, hp, rng):
            with _autocast(hp.feature_dtype):
                logits = cls_head_logits(model, *train.batch(rows))
            loss = torch.nn.functional.cross_entropy(logits.float(), y[rows])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            total += float(loss.detach()) * len(rows)
            count += len(rows)
        val_acc = float((predict_logits(model, validation).argmax(1) == y_val).mean())
        history.append(
            {"epoch": epoch, "train_loss": total / count, "validation_accuracy": val_acc}
        )
        log(f"    epoch {epoch}: train loss {total / count:.4f}, validation accuracy {val_acc:.4f}")
        if best is None or val_acc > best[0]:
            best = (val_acc, epoch, copy.deepcopy(model.state_dict()))
    assert best is not None
    model.load_state_dict(best[2])
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return TrainResult(best[1], history, time.perf_counter() - start)
