"""The classifier: a standard ``BertForSequenceClassification`` on all-MiniLM-L6-v2, trained fast.

The checkpoint is the stock architecture (``[CLS]`` of the last layer -> pooler dense + tanh ->
dropout -> linear), so ``AutoModelForSequenceClassification.from_pretrained`` loads it without
custom code. What makes training fit in the budget is *how* it is trained, not *what* is saved:

- the logits depend on the last layer's output at ``[CLS]`` only. So the last layer is trained
  at that one position: its query, attention output, feed-forward and LayerNorms, with the pooler
  and the classifier (:func:`cls_head_logits`); its key and value projections stay frozen;
- everything frozen runs once over the corpus (:func:`encode_frozen`): embeddings and the first
  ``L - 1`` layers, and the last layer's keys and values of every token, cached ragged (no padding).
  A training step then costs one token's worth of the last layer, not a sequence's.

The split computation is exact (a unit test compares it with the full model).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer
from torch.nn import functional
from transformers import BertForSequenceClassification

from tritonforge.tasks.classification.export.training.data import LABELS


def load_base(model_dir: Path, seed: int) -> BertForSequenceClassification:
    """The base encoder's weights in a sequence-classification model with our labels; the new
    weights (the classifier, and the pooler if the checkpoint has none) come from ``seed``."""
    torch.manual_seed(seed)
    model = BertForSequenceClassification.from_pretrained(
        model_dir,
        num_labels=len(LABELS),
        id2label=dict(enumerate(LABELS)),
        label2id={lab: i for i, lab in enumerate(LABELS)},
        problem_type="single_label_classification",
        attn_implementation="sdpa",
    )
    model.eval()
    return model


def tokenize(
    tokenizer: Tokenizer, texts: Sequence[str], max_length: int
) -> tuple[list[list[int]], int]:
    """Token ids with ``[CLS]``/``[SEP]``, truncated to ``max_length`` (no padding), and how many
    texts were truncated."""
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length)
    encodings = tokenizer.encode_batch(list(texts))
    return [e.ids for e in encodings], sum(1 for e in encodings if e.overflowing)


@dataclass
class Features:
    """The frozen part of the model for each row, ragged: row ``i``'s tokens are
    ``kv[offsets[i]:offsets[i] + lengths[i]]`` (the last layer's key and value projections,
    concatenated); ``cls`` is the input of the last layer at ``[CLS]``; ``mean`` is the frozen
    last layer's mean-pooled embedding (the linear-probe floor's input)."""

    kv: torch.Tensor  # [tokens, 2 * hidden]
    offsets: np.ndarray
    lengths: np.ndarray
    cls: torch.Tensor  # [rows, hidden], float32
    mean: torch.Tensor  # [rows, hidden], float32

    def __len__(self) -> int:
        return len(self.lengths)

    def subset(self, rows: Sequence[int]) -> Features:
        """The rows ``rows`` (a view: the token store is shared)."""
        index = np.asarray(rows, dtype=np.int64)
        return Features(
            self.kv, self.offsets[index], self.lengths[index], self.cls[index], self.mean[index]
        )

    def batch(self, rows: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``[B, H]`` [CLS] inputs, padded ``[B, T, 2H]`` keys|values (float32) and the ``[B, T]``
        bool mask of real tokens."""
        lengths = torch.from_numpy(self.lengths[list(rows)])
        width = int(lengths.max())
        mask = torch.arange(width)[None, :] < lengths[:, None]
        index = torch.from_numpy(self.offsets[list(rows)])[:, None] + torch.arange(width)[None, :]
        kv = self.kv[index.clamp_max(self.kv.shape[0] - 1)].float()
        kv[~mask] = 0.0
        return self.cls[list(rows)], kv, mask


def _autocast(dtype: str) -> contextlib.AbstractContextManager[Any]:
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=getattr(torch, dtype))


def length_batches(lengths: np.ndarray, batch_size: int) -> Iterator[list[int]]:
    """Row indices in batches of similar length (sorted, stable), for little padding."""
    order = np.argsort(lengths, kind="stable")
    for start in range(0, len(order), batch_size):
        yield order[start : start + batch_size].tolist()


@torch.inference_mode()
def encode_frozen(
    model: BertForSequenceClassification,
    ids: Sequence[Sequence[int]],
    dtype: str,
    batch_size: int,
    store_dtype: torch.dtype = torch.bfloat16,
) -> Features:
    """Run the frozen encoder once over ``ids`` (autocast to ``dtype``); see :class:`Features`."""
    lengths = np.array([len(x) for x in ids], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    hidden_size = model.config.hidden_size
    last = _last_layer(model).attention.self
    kv = torch.empty(int(lengths.sum()), 2 * hidden_size, dtype=store_dtype)
    cls = torch.empty(len(ids), hidden_size, dtype=torch.float32)
    mean = torch.empty(len(ids), hidden_size, dtype=torch.float32)
    with _autocast(dtype):
        for rows in length_batches(lengths, batch_size):
            width = int(lengths[rows].max())
            input_ids = torch.zeros(len(rows), width, dtype=torch.long)
            for j, i in enumerate(rows):
                input_ids[j, : lengths[i]] = torch.tensor(ids[i])
            mask = (torch.arange(width)[None, :] < torch.from_numpy(lengths[rows])[:, None]).long()
            out = model.bert(input_ids=input_ids, attention_mask=mask, output_hidden_states=True)
            below = out.hidden_states[-2]
            keys_values = torch.cat([last.key(below), last.value(below)], dim=-1).float()
            m = mask.unsqueeze(-1).float()
            mean[rows] = (out.last_hidden_state.float() * m).sum(1) / m.sum(1)
            cls[rows] = below[:, 0].float()
            for j, i in enumerate(rows):
                o, n = int(offsets[i]), int(lengths[i])
                kv[o : o + n] = keys_values[j, :n].to(store_dtype)
    return Features(kv, offsets, lengths, cls, mean)


def _last_layer(model: BertForSequenceClassification) -> Any:
    """The last ``BertLayer`` (typed ``Any``: torch's ``Module.__getattr__`` types defeat mypy)."""
    return model.bert.encoder.layer[-1]


def cls_head_logits(
    model: BertForSequenceClassification,
    cls: torch.Tensor,
    kv: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    """The model's logits from :class:`Features` (exact): its last ``BertLayer`` evaluated at
    position 0 with the cached keys and values, then the pooler and the classifier."""
    layer = _last_layer(model)
    attn = layer.attention.self
    heads, size = attn.num_attention_heads, attn.attention_head_size
    b, t, _ = kv.shape
    hidden = cls[:, None, :]
    q = attn.query(hidden).view(b, 1, heads, size).transpose(1, 2)
    k, v = (x.reshape(b, t, heads, size).transpose(1, 2) for x in kv.split(heads * size, dim=-1))
    bias = torch.zeros(b, 1, 1, t, dtype=q.dtype)
    bias = bias.masked_fill(~mask[:, None, None, :], torch.finfo(q.dtype).min)
    p = attn.dropout.p if model.training else 0.0
    ctx = functional.scaled_dot_product_attention(
        q, k.to(q.dtype), v.to(q.dtype), attn_mask=bias, dropout_p=p, scale=attn.scaling
    )
    ctx = ctx.transpose(1, 2).reshape(b, 1, heads * size)
    attention_output = layer.attention.output(ctx, hidden)
    hidden = layer.output(layer.intermediate(attention_output), attention_output)
    pooler: Any = model.bert.pooler
    logits: torch.Tensor = model.classifier(model.dropout(pooler(hidden)))
    return logits


def trainable_parameters(model: BertForSequenceClassification) -> list[torch.nn.Parameter]:
    """Freeze everything but the last layer (its key and value projections aside: they are
    cached), the pooler and the classifier; returns the trainable parameters."""
    for p in model.parameters():
        p.requires_grad_(False)
    layer = _last_layer(model)
    frozen = {
        id(p)
        for m in (layer.attention.self.key, layer.attention.self.value)
        for p in m.parameters()
    }
    modules: list[Any] = [layer, model.bert.pooler, model.classifier]
    params = [p for m in modules for p in m.parameters() if id(p) not in frozen]
    for p in params:
        p.requires_grad_(True)
    return params
