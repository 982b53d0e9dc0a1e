"""Pipeline specs from Hugging Face checkpoint directories (the bring-your-own-model path).

:func:`pipeline_from_pretrained` turns ``DIR`` + a task into a full :class:`PipelineSpec` with the
same verification as the default model: shape grid, padded batches, atol+rtol, int8 audit and gate
(cosine for embeddings, top-1 agreement + probability bound for classifiers), TorchScript, atomic
writes and sidecars. The default pipelines (:mod:`export.specs.minilm`) are built with it too, so a
user's checkpoint and ours take the same road; they only override knobs measured for them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from tritonforge.export.errors import SpecError
from tritonforge.export.models.hf import CheckpointInfo, inspect_checkpoint, load_hf_encoder
from tritonforge.export.pipeline_spec import PipelineSpec
from tritonforge.export.spec import (
    BATCH_AXIS,
    ExportSpec,
    GraphOptimization,
    Inputs,
    QualityGate,
    Quantization,
    Serving,
    TensorDecl,
)
from tritonforge.export.specs.text_inputs import DATA_DIR, disjoint_sentences
from tritonforge.export.task_share import share_of
from tritonforge.text import TextTokenizer

SEQ_AXIS = "sequence_length"
CALIBRATION_FILE = DATA_DIR / "calibration.txt"
EVALUATION_FILE = DATA_DIR / "evaluation.txt"
DEFAULT_MAX_LENGTH = 256
# Parity grid: batch x sequence, cut at the pipeline's max_length; mixed-length padded batches.
GRID_BATCHES = (1, 2, 7, 64)
GRID_LENGTHS = (1, 5, 64, 256)
MIXED = (
    (5, 17, 3, 64),
    (256, 1, 40),
    tuple(2 + (i * 37) % 62 for i in range(64)),
)
# Greedy int8 exclusion candidates: one group per weight role across all layers. Node names come
# from module paths (torch.onnx scopes): BERT/RoBERTa/XLM-R spell them one way, DistilBERT another.
SENSITIVITY_GROUPS = (
    r"/attention/self/query/|/attention/q_lin/",
    r"/attention/self/key/|/attention/k_lin/",
    r"/attention/self/value/|/attention/v_lin/",
    r"/attention/output/dense/|/attention/out_lin/",
    r"/intermediate/dense/|/ffn/lin1/",
    r"/layer\.\d+/output/dense/|/ffn/lin2/",
    r"/pooler/|/pre_classifier/|/classifier/",
)
TextsFn = Callable[[], list[str]]


def default_texts(path: Path, held_out: Path) -> list[str]:
    return disjoint_sentences(path, held_out)


def _token_rows(lengths: Sequence[int], rng: np.random.Generator, info: CheckpointInfo) -> Inputs:
    """Rows ``CLS w... SEP`` of the given lengths, padded with the pad token to the longest."""
    width = max(lengths)
    low = min(1000, max(info.vocab_size // 4, 5))
    ids = np.full((len(lengths), width), info.pad_token_id, dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = rng.integers(low, info.vocab_size, size=n)
        ids[row, 0] = info.cls_token_id
        if n >= 2:
            ids[row, n - 1] = info.sep_token_id
        mask[row, :n] = 1
    full = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    return {name: full[name] for name in info.input_names}


def _corpus(
    texts: TextsFn, tokenizer: Callable[[], TextTokenizer], batch: int, by_length: bool = False
) -> list[Inputs]:
    """``texts`` tokenized in batches of ``batch``, in their order or (``by_length``) grouped by
    token count, which pads far less (a gate's figures are per row, so the order is free)."""
    tok = tokenizer()
    sentences = texts()
    if by_length:
        return tok.encode_by_length(sentences, batch)[1]
    return [tok.encode(sentences[i : i + batch]) for i in range(0, len(sentences), batch)]


def _tokenizer(info: CheckpointInfo, max_length: int) -> TextTokenizer:
    return TextTokenizer(
        info.directory / "tokenizer.json",
        max_length,
        outputs=info.input_names,
        pad_id=info.pad_token_id,
    )


def _warmup(tokenizer: Callable[[], TextTokenizer], text: str) -> Inputs:
    return tokenizer().encode([text])


def _build(info: CheckpointInfo, task: str) -> nn.Module:
    return load_hf_encoder(info, task)


def _max_length(info: CheckpointInfo, requested: int | None) -> int:
    sentence_config = info.directory / "sentence_bert_config.json"
    if requested is None and sentence_config.exists():
        import json

        requested = int(json.loads(sentence_config.read_text())["max_seq_length"])
    length = min(requested or DEFAULT_MAX_LENGTH, info.max_positions)
    return length - length % 16 if length >= 16 else length


def checkpoint_files(directory: Path) -> tuple[Path, ...]:
    """The files of a checkpoint that define the export (hashed: a change re-exports)."""
    names = (
        "config.json",
        "model.safetensors",
        "pytorch_model.bin",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "modules.json",
        "sentence_bert_config.json",
    )
    found = [directory / n for n in names if (directory / n).is_file()]
    found += sorted(directory.glob("*_Pooling/config.json"))
    return tuple(found)


DEFAULT_CORPUS_SOURCE = (
    f"export/data/{CALIBRATION_FILE.name}",
    f"export/data/{EVALUATION_FILE.name}",
)


def _quantization(
    keep_fp32: tuple[str, ...], keep_fp32_by_target: tuple[tuple[str, tuple[str, ...]], ...]
) -> Quantization:
    # int8 per target (Quantization.methods' default): dynamic on CPU (ONNX Runtime's
    # MatMulInteger kernels, docs/performance.md), calibrated static QDQ for TensorRT hosts.
    return Quantization(
        op_types=("MatMul",),
        sensitivity_groups=SENSITIVITY_GROUPS,
        max_search_rounds=3,
        keep_fp32=keep_fp32,
        keep_fp32_by_target=keep_fp32_by_target,
    )


def _pipeline_name(directory: Path, name: str | None) -> str:
    """``name``, or the directory's name made an identifier; lowercase letters, digits and _."""
    name = name or re.sub(r"[^A-Za-z0-9_]+", "_", directory.resolve().name).strip("_").lower()
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name or ""):
        raise SpecError(f"pipeline name {name!r}: use lowercase letters, digits and _")
    return name


def _token_inputs(info: CheckpointInfo) -> tuple[TensorDecl, ...]:
    """The tokenizer's inputs, in its order (padding input_ids with the pad token)."""
    return tuple(
        TensorDecl(
            n,
            "int64",
            (BATCH_AXIS, SEQ_AXIS),
            pad_value=info.pad_token_id if n == "input_ids" else 0,
        )
        for n in info.input_names
    )


def pipeline_from_pretrained(
    directory: Path,
    task: str,
    name: str | None = None,
    *,
    max_length: int | None = None,
    max_batch: int = 64,
    normalize: bool | None = None,
    calibration_texts: TextsFn | None = None,
    evaluation_texts: TextsFn | None = None,
    evaluation_batch: int = 8,
    evaluation_by_length: bool = False,
    corpus_source: tuple[str, str] | None = None,
    export_name: str | None = None,
    gate: QualityGate | None = None,
    serving: Serving | None = None,
    top_k: int = 3,
    extra_sources: Sequence[Path] = (),
    keep_fp32: tuple[str, ...] = (),
    keep_fp32_by_target: tuple[tuple[str, tuple[str, ...]], ...] = (),
    **pipeline: Any,
) -> PipelineSpec:
    """A complete pipeline spec for a Hugging Face checkpoint ``directory``.

    ``task``: ``embedding`` (mean-pooled last hidden state, normalised when the checkpoint says
    so) or ``classification`` (logits; labels from ``id2label``). ``name`` defaults to the
    directory's name. The int8 corpora default to the project's generic English sentences.
    ``pipeline`` passes :class:`PipelineSpec` fields (``stage_prefix``, ``tokenizer``, ``bls``...);
    ``export_name`` names the encoder export in logs and reports (default ``name``).
    ``evaluation_by_length`` batches the gate's held-out texts (``evaluation_batch`` rows) by
    token count: a large held-out set then costs about its real tokens, not its padding.
    """
    directory = Path(directory)
    info = inspect_checkpoint(directory, normalize)
    name = _pipeline_name(directory, name)
    length = _max_length(info, max_length)
    tokenizer = partial(_tokenizer, info, length)
    share = share_of(task)
    output, default_gate = share.encoder_output(directory, info)
    calibration = calibration_texts or partial(default_texts, CALIBRATION_FILE, EVALUATION_FILE)
    evaluation = evaluation_texts or partial(default_texts, EVALUATION_FILE, CALIBRATION_FILE)
    sources = corpus_source or DEFAULT_CORPUS_SOURCE
    warmup_text = "Triton warms this model up with a real tokenized sentence."
    optimizer = info.optimizer_type
    encoder = ExportSpec(
        name=export_name or name,
        description=f"{info.model_type} checkpoint {directory.name} ({task})",
        build_module=partial(_build, info, task),
        inputs=_token_inputs(info),
        outputs=(output,),
        example_inputs=partial(_token_rows, info=info),
        max_batch=max_batch,
        max_length=length,
        grid=tuple((b, s) for b in GRID_BATCHES for s in GRID_LENGTHS if s <= length),
        mixed_batches=tuple(m for m in MIXED if max(m) <= length),
        benchmark_lengths=(min(64, length),) * 8,
        calibration=partial(_corpus, calibration, tokenizer, 8),
        calibration_source=sources[0],
        evaluation=partial(_corpus, evaluation, tokenizer, evaluation_batch, evaluation_by_length),
        evaluation_source=sources[1],
        quality_gate=gate or default_gate,
        quantization=_quantization(keep_fp32, keep_fp32_by_target),
        optimization=(
            GraphOptimization(optimizer, info.num_heads, info.hidden_size) if optimizer else None
        ),
        serving=replace(serving or Serving(fp32_name=""), warmup_text=warmup_text),
        warmup=partial(_warmup, tokenizer, warmup_text),
        source_files=(*checkpoint_files(directory), *extra_sources),
    )
    return PipelineSpec(
        name=name,
        task=task,
        encoder=encoder,
        tokenizer_file=directory / "tokenizer.json",
        description=encoder.description,
        **share.pipeline_fields(info, top_k),
        **pipeline,
    )
