"""A BERT encoder in plain torch whose parameter names match Hugging Face's ``BertModel``.

Only what sentence-transformers' all-MiniLM-L6-v2 needs: absolute position embeddings, erf GELU,
post-LayerNorm blocks, and attention-mask mean pooling. The attention is written as explicit
MatMul/Softmax ops (not SDPA) so the exported ONNX graph matches the patterns ONNX Runtime's
transformer optimizer fuses.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float

    @classmethod
    def from_file(cls, path: Path) -> BertConfig:
        raw = json.loads(path.read_text())
        if raw.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"{path}: hidden_act {raw['hidden_act']!r} is not supported")
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{path}: only absolute position embeddings are supported")
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__})


class BertEmbeddings(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        x = (
            self.word_embeddings(input_ids)
            + self.token_type_embeddings(token_type_ids)
            + self.position_embeddings(positions)
        )
        return self.LayerNorm(x)


class BertSelfAttention(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.num_heads = c.num_attention_heads
        self.head_size = c.hidden_size // c.num_attention_heads
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        shape = (*x.size()[:-1], self.num_heads, self.head_size)
        return x.view(shape).permute(0, 2, 1, 3)

    def forward(self, h: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        q = self._heads(self.query(h))
        k = self._heads(self.key(h))
        v = self._heads(self.value(h))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_size)
        probs = torch.softmax(scores + mask_bias, dim=-1)
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return ctx.view(*ctx.size()[:-2], self.num_heads * self.head_size)


class BertSelfOutput(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class BertAttention(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(c)
        self.output = BertSelfOutput(c)

    def forward(self, h: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(h, mask_bias), h)


class BertIntermediate(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(self.dense(x))


class BertOutput(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(c.intermediate_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class BertLayer(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.attention = BertAttention(c)
        self.intermediate = BertIntermediate(c)
        self.output = BertOutput(c)

    def forward(self, h: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        a = self.attention(h, mask_bias)
        return self.output(self.intermediate(a), a)


class BertEncoder(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(c) for _ in range(c.num_hidden_layers))

    def forward(self, h: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            h = layer(h, mask_bias)
        return h


class BertSentenceEncoder(nn.Module):
    """``(input_ids, attention_mask, token_type_ids) -> sentence_embedding`` [batch, hidden].

    The embedding is the attention-mask mean of the last hidden state, unit-L2 when ``normalize``
    (sentence-transformers' ``Normalize`` module, in the graph so no serving stage has to do it):
    padded positions contribute nothing, so a padded batch gives exactly the unpadded rows' results.
    """

    def __init__(self, c: BertConfig, normalize: bool = False) -> None:
        super().__init__()
        self.embeddings = BertEmbeddings(c)
        self.encoder = BertEncoder(c)
        self.normalize = normalize

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        h = self.embeddings(input_ids, token_type_ids)
        mask = attention_mask.to(h.dtype)
        mask_bias = (1.0 - mask[:, None, None, :]) * torch.finfo(h.dtype).min
        h = self.encoder(h, mask_bias)
        weights = mask.unsqueeze(-1)
        summed = (h * weights).sum(dim=1)
        counts = weights.sum(dim=1).clamp(min=1e-9)
        pooled = summed / counts
        if self.normalize:
            # As torch.nn.functional.normalize, written with broadcasting so the exported
            # graph keeps the static hidden size (normalize's expand_as makes it symbolic).
            norm = torch.linalg.vector_norm(pooled, ord=2, dim=1, keepdim=True)
            pooled = pooled / norm.clamp(min=1e-12)
        return pooled


def has_normalize_module(model_dir: Path) -> bool:
    """Whether a sentence-transformers checkpoint ends with ``Normalize`` (its ``modules.json``)."""
    path = model_dir / "modules.json"
    if not path.exists():
        return False
    modules = json.loads(path.read_text())
    return any(str(m.get("type", "")).endswith(".Normalize") for m in modules)


def load_sentence_encoder(model_dir: Path, normalize: bool | None = None) -> BertSentenceEncoder:
    """Build the encoder from ``config.json`` + ``model.safetensors`` (strict: every weight used).

    ``normalize`` defaults to what the checkpoint's ``modules.json`` declares.
    """
    from safetensors.torch import load_file

    if normalize is None:
        normalize = has_normalize_module(model_dir)
    module = BertSentenceEncoder(BertConfig.from_file(model_dir / "config.json"), normalize)
    state = load_file(str(model_dir / "model.safetensors"))
    state = {
        k: v
        for k, v in state.items()
        if not k.startswith("pooler.") and not k.endswith("position_ids")
    }
    module.load_state_dict(state, strict=True)
    return module.eval()
