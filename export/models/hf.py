"""Hugging Face encoders (BERT, DistilBERT, RoBERTa, XLM-R, ...) as export-ready modules.

:func:`load_hf_encoder` loads a checkpoint directory with ``transformers`` and wraps it so that its
inputs are exactly the tokenizer's ``model_input_names`` (positional, in that order) and its one
output is what the task serves:

* ``embedding``: the attention-mask mean of the last hidden state, unit-L2 when the checkpoint's
  sentence-transformers ``modules.json`` declares ``Normalize`` (or when asked);
* ``classification``: the sequence-classification head's logits.

Attention is loaded as ``eager`` (explicit MatMul/Softmax): the exported graph then matches the
patterns ONNX Runtime's transformer optimizer fuses into ``Attention`` (measured on
all-MiniLM-L6-v2: 6 Attention + EmbedLayerNormalization fused, as with the hand-written BERT this
replaced, and ONNX vs PyTorch within 2.4e-7; SDPA fuses no attention).
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tritonforge import tasks
from tritonforge.export.errors import SpecError

INPUT_ORDER = ("input_ids", "attention_mask", "token_type_ids")
# transformers model_type -> ONNX Runtime transformer optimizer model_type (its fusions).
OPTIMIZER_TYPES = {
    "bert": "bert",
    "distilbert": "bert",
    "roberta": "bert",
    "xlm-roberta": "bert",
    "camembert": "bert",
    "electra": "bert",
    "mpnet": "bert",
}


@dataclass(frozen=True)
class CheckpointInfo:
    """What the exporter needs to know about a checkpoint directory, read once."""

    directory: Path
    model_type: str
    input_names: tuple[str, ...]
    pad_token_id: int
    cls_token_id: int
    sep_token_id: int
    vocab_size: int
    hidden_size: int
    num_heads: int
    max_positions: int
    labels: tuple[str, ...]  # classification: id2label in index order
    normalize: bool  # embedding: sentence-transformers Normalize module

    @property
    def optimizer_type(self) -> str | None:
        return OPTIMIZER_TYPES.get(self.model_type)


def has_normalize_module(directory: Path) -> bool:
    """Whether a sentence-transformers checkpoint ends with ``Normalize`` (its ``modules.json``)."""
    path = directory / "modules.json"
    if not path.exists():
        return False
    modules = json.loads(path.read_text())
    return any(str(m.get("type", "")).endswith(".Normalize") for m in modules)


def _token_id(tokenizer: Any, *attrs: str) -> int:
    for attr in attrs:
        value = getattr(tokenizer, attr, None)
        if isinstance(value, int):
            return value
    return 0


def _quiet_transformers() -> None:
    """transformers' weight-loading bars and config notices would interleave with the export's
    own progress; its errors still raise."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def inspect_checkpoint(directory: Path, normalize: bool | None = None) -> CheckpointInfo:
    """Read config.json and the tokenizer of ``directory``; :class:`SpecError` says what is
    missing (a Hugging Face checkpoint needs config.json, weights and tokenizer.json)."""
    directory = Path(directory)
    missing = [f for f in ("config.json", "tokenizer.json") if not (directory / f).is_file()]
    if not any((directory / f).is_file() for f in ("model.safetensors", "pytorch_model.bin")):
        missing.append("model.safetensors")
    if missing:
        raise SpecError(
            f"{directory} is not a Hugging Face checkpoint directory: missing {missing} "
            "(save it with `model.save_pretrained(dir)` and `tokenizer.save_pretrained(dir)`)"
        )
    _quiet_transformers()
    from transformers import AutoConfig, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(str(directory))
        tokenizer = AutoTokenizer.from_pretrained(str(directory))
    except (OSError, ValueError, KeyError) as e:
        raise SpecError(f"transformers cannot load {directory}: {e}") from e
    id2label = getattr(config, "id2label", None) or {}
    labels = tuple(str(id2label[i]) for i in sorted(int(k) for k in id2label))
    # Canonical order (BERT's tokenizer lists token_type_ids second): the encoder's inputs, the
    # tokenizer model's outputs and TorchScript's INPUT__i positions all follow it.
    given = set(tokenizer.model_input_names)
    if not {"input_ids", "attention_mask"} <= given or given - set(INPUT_ORDER):
        raise SpecError(
            f"{directory}: tokenizer inputs {sorted(given)} are not supported "
            f"(input_ids and attention_mask, optionally token_type_ids)"
        )
    names = tuple(n for n in INPUT_ORDER if n in given)
    positions = int(getattr(config, "max_position_embeddings", 512))
    if config.model_type in ("roberta", "xlm-roberta", "camembert"):
        positions -= int(config.pad_token_id or 0) + 1  # positions start after padding_idx
    return CheckpointInfo(
        directory=directory,
        model_type=str(config.model_type),
        input_names=names,
        pad_token_id=int(tokenizer.pad_token_id or 0),
        cls_token_id=_token_id(tokenizer, "cls_token_id", "bos_token_id"),
        sep_token_id=_token_id(tokenizer, "sep_token_id", "eos_token_id"),
        vocab_size=int(config.vocab_size),
        hidden_size=int(getattr(config, "hidden_size", 0) or getattr(config, "dim", 0)),
        num_heads=int(getattr(config, "num_attention_heads", 0) or getattr(config, "n_heads", 0)),
        max_positions=positions,
        labels=labels,
        normalize=has_normalize_module(directory) if normalize is None else normalize,
    )


def device_portable_kwargs(model: nn.Module, kwargs: dict[str, torch.Tensor]) -> dict[str, Any]:
    """``kwargs`` with what transformers would otherwise build inside ``forward`` built here from
    the inputs: the attention mask as the 4-D additive mask (transformers returns a 4-D mask
    unchanged) and zero token types where the model has them and the tokenizer gives none.

    A trace freezes the device of every tensor created inside ``forward`` (transformers' mask
    helpers call ``torch.arange(..., device=mask.device)``), so a TorchScript traced on the CPU
    then fails on a GPU (the native PyTorch backend with ``KIND_GPU``; found on an H200 with
    ``python -m tritonforge.deploy.torchscript_gpu``). Same values as the plain call. The ONNX
    export keeps the 2-D mask: ONNX has no device, and ORT's attention fusion expects that pattern.
    """
    mask = kwargs["attention_mask"]
    dtype: torch.dtype = getattr(model, "dtype", torch.float32)  # a transformers model's
    portable: dict[str, Any] = dict(kwargs)
    portable["attention_mask"] = (1.0 - mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min
    takes_types = "token_type_ids" in inspect.signature(model.forward).parameters
    if takes_types and "token_type_ids" not in kwargs:
        portable["token_type_ids"] = torch.zeros_like(kwargs["input_ids"])
    return portable


class _Encoder(nn.Module):
    """Positional inputs (the tokenizer's names) -> one tensor (pooled embedding or logits)."""

    def __init__(self, model: nn.Module, input_names: tuple[str, ...], task: str, normalize: bool):
        super().__init__()
        self.model = model
        self.input_names = input_names
        self.task = task
        self.logits = tasks.get(task).encoder_output == tasks.LOGITS
        self.normalize = normalize

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        kwargs = dict(zip(self.input_names, inputs, strict=True))
        mask = kwargs["attention_mask"]
        if not torch.onnx.is_in_onnx_export():
            kwargs = device_portable_kwargs(self.model, kwargs)
        out = self.model(**kwargs)
        if self.logits:
            return out.logits
        hidden = out.last_hidden_state
        weights = mask.to(hidden.dtype).unsqueeze(-1)
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
        if self.normalize:
            # As torch.nn.functional.normalize, written with broadcasting so the exported
            # graph keeps the static hidden size (normalize's expand_as makes it symbolic).
            norm = torch.linalg.vector_norm(pooled, ord=2, dim=1, keepdim=True)
            pooled = pooled / norm.clamp(min=1e-12)
        return pooled


def load_hf_encoder(info: CheckpointInfo, task: str) -> nn.Module:
    """The checkpoint as an eval-mode module ``(*inputs) -> embedding | logits``."""
    if task not in tasks.names(tasks.PIPELINE):
        raise SpecError(f"task {task!r} is not one of {list(tasks.names(tasks.PIPELINE))}")
    from transformers import AutoModel, AutoModelForSequenceClassification

    declared = tasks.get(task)
    logits = declared.encoder_output == tasks.LOGITS
    cls = AutoModelForSequenceClassification if logits else AutoModel
    _quiet_transformers()
    try:
        model = cls.from_pretrained(str(info.directory), attn_implementation="eager")
    except (OSError, ValueError) as e:
        raise SpecError(f"transformers cannot load {info.directory} for {task}: {e}") from e
    if declared.labels and not info.labels:
        raise SpecError(f"{info.directory}: config.json has no id2label for a classifier")
    return _Encoder(model.eval(), info.input_names, task, info.normalize).eval()
