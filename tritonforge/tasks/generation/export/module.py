"""A traceable KV-cache forward over a Hugging Face Llama-family model.

``forward(input_ids, attention_mask, position_ids, past_0_key, past_0_value, ...)`` returns
``(logits, present_0_key, present_0_value, ...)`` with

* ``input_ids``/``position_ids``: [batch, sequence] (positions per row, so rows of a batch may
  sit at different offsets: the in-flight batcher left-pads shorter caches);
* ``attention_mask``: [batch, total_sequence] over past + new columns (1 = attend, 0 = padding);
* ``past_*``: [batch, kv_heads, past_sequence, head_dim]; ``present_*`` = past ++ new along the
  sequence axis.

The module reuses the model's own layers (projections, norms, MLP, rotary embedding) and only
spells out attention with an explicit cache and a causal + padding mask, which traces into a plain
ONNX graph (Hugging Face's cache classes and mask builders do not trace with a dynamic past).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class KVCacheDecoder(nn.Module):
    """Wrap ``model`` (a ``LlamaForCausalLM``) as a stateless step function; see the module doc."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        cfg = model.config
        self.model = model
        self.layers = len(model.model.layers)
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(cfg.num_key_value_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        *past: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        inner = self.model.model
        hidden = inner.embed_tokens(input_ids)
        cos, sin = inner.rotary_emb(hidden, position_ids)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        batch, seq = input_ids.shape[0], input_ids.shape[1]
        total = attention_mask.shape[1]
        # Query i sits at cache column (total - seq + i); it sees columns <= that, unmasked.
        q_col = torch.arange(seq, device=input_ids.device) + (total - seq)
        k_col = torch.arange(total, device=input_ids.device)
        causal = k_col.unsqueeze(0) <= q_col.unsqueeze(1)  # [seq, total]
        allowed = causal.unsqueeze(0) & attention_mask.bool().unsqueeze(1)  # [b, seq, total]
        neg = torch.finfo(hidden.dtype).min
        bias = torch.zeros(allowed.shape, dtype=hidden.dtype).masked_fill(~allowed, neg)
        bias = bias.unsqueeze(1)  # [b, 1, seq, total]
        presents: list[torch.Tensor] = []
        groups = self.heads // self.kv_heads
        for i, layer in enumerate(inner.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            q = attn.q_proj(x).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            k = torch.cat((past[2 * i], k), dim=2)
            v = torch.cat((past[2 * i + 1], v), dim=2)
            presents += [k, v]
            kk = k.repeat_interleave(groups, dim=1)
            vv = v.repeat_interleave(groups, dim=1)
            scores = torch.matmul(q, kk.transpose(2, 3)) * (self.head_dim**-0.5) + bias
            probs = torch.softmax(scores, dim=-1)
            out = torch.matmul(probs, vv).transpose(1, 2).reshape(batch, seq, -1)
            hidden = hidden + attn.o_proj(out)
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        logits = self.model.lm_head(inner.norm(hidden))
        return (logits, *presents)
