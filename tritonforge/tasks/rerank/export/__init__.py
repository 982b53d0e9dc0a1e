"""The rerank task's export layer: locate its model package, import a cross-encoder graph
(``--from-onnx``: checks, grid, padded rows, sidecars) and score in-process with ONNX Runtime.

:class:`OrtReranker` is the reference served scores are compared with: the same graph, the same
pair tokenization, the same batching rule as the served encoder (a dynamic int8 graph quantizes
activations per batch, so its rows run alone: a score never depends on the batch; docs/rerank.md).
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from tritonforge.batching import AxisNames, infer_rows, infer_trimmed, rows_alone
from tritonforge.export.errors import ExportError
from tritonforge.export.onnx_export import torch_to_onnx
from tritonforge.export.onnx_import import (
    MODEL_FILE,
    TOKENIZER_FILE,
    GridSettings,
    ImportedGraph,
    OnnxImportError,
    axis_renames,
    inspect_graph,
    run_grid,
    token_inputs,
    write_model,
)
from tritonforge.export.parity import compare_outputs, ort_runner
from tritonforge.export.spec import TensorDecl
from tritonforge.model_packages import INSTALL_COMMAND, ModelPackagesMissingError
from tritonforge.tasks.rerank.pairs import PairTokenizer, input_tokens
from tritonforge.tasks.rerank.protocol import Ranked
from tritonforge.tasks.rerank.scores import pair_logits, ranked, ranking, sigmoid
from tritonforge.tasks.rerank.spec import RerankSpec
from tritonforge.text import TOKENIZER_OUTPUTS

# Real text the grid's token windows come from (a dynamic int8 graph's error depends on how
# real the activations look); any English prose does.
GRID_TEXT = (
    "Berlin is the capital and largest city of Germany by both area and population. "
    "A cross-encoder reads the query and the document together and answers one relevance "
    "logit; reranking sorts the candidates a fast retriever found by that score. "
    "The Triton Inference Server batches requests, runs the model and returns the outputs. "
    "Cats are small domesticated carnivores that have lived with people for thousands of years."
)


def package_dir(spec: RerankSpec) -> Path:
    """The directory holding ``spec``'s graph and tokenizer inside its model package."""
    found = importlib.util.find_spec(spec.package)
    if found is None or found.origin is None:
        raise ModelPackagesMissingError(
            f"model package {spec.package!r} is not installed; run `{INSTALL_COMMAND}`"
        )
    return Path(found.origin).parent / spec.package_dir


def rerank_io_failures(graph: ImportedGraph) -> list[str]:
    """What a cross-encoder graph must be beyond a token graph: inputs among
    ``input_ids``/``attention_mask``/``token_type_ids`` (``input_ids`` included) and one float
    output ``[batch, 1]`` (one logit per pair)."""
    failures = []
    names = [t.name for t in graph.io.inputs]
    unknown = sorted(set(names) - set(TOKENIZER_OUTPUTS))
    if unknown or "input_ids" not in names:
        failures.append(
            f"inputs {names}: a cross-encoder takes input_ids (+ attention_mask, token_type_ids)"
        )
    outputs = graph.io.outputs
    if len(outputs) != 1 or list(outputs[0].dims[1:]) != [1]:
        shown = [(t.name, list(t.dims)) for t in outputs]
        failures.append(f"outputs {shown}: a cross-encoder answers one logit per pair [batch, 1]")
    return failures


def grid_settings(spec: RerankSpec, tokenizer_path: Path) -> GridSettings:
    """The import grid for ``spec``: up to its ``max_length``, token windows of real text,
    padded rows within ``spec.padded_atol``."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    tokenizer.no_truncation()
    pool = tokenizer.encode(" ".join([GRID_TEXT] * 8), add_special_tokens=False).ids
    padding = tokenizer.padding or {}
    lengths = [4, 16, 64, 128, spec.max_length]
    return GridSettings(
        shapes=tuple(
            (b, min(n, spec.max_length)) for b, n in zip((1, 2, 4, 3, 1), lengths, strict=True)
        ),
        mixed_lengths=tuple(min(n, spec.max_length) for n in (5, 17, 64, 9)),
        atol=spec.padded_atol,
        vocab_size=tokenizer.get_vocab_size(),
        pad_id=int(padding.get("pad_id", 0)),
        token_pool=tuple(pool),
    )


def verify_reranker(source: Path, spec: RerankSpec, threads: int = 1) -> ImportedGraph:
    """Check ``source/model.onnx`` (+ ``tokenizer.json``) as ``spec``'s cross-encoder: the
    generic import checks, the cross-encoder's tensors, the grid and padded rows; one
    :class:`OnnxImportError` lists every failure."""
    tokenizer = source / TOKENIZER_FILE
    if not tokenizer.is_file():
        raise OnnxImportError([f"{tokenizer} does not exist: a reranker needs its tokenizer.json"])
    graph = inspect_graph(source / MODEL_FILE)
    failures = rerank_io_failures(graph)
    if not failures:
        failures = run_grid(graph, ort_runner(graph.path, threads), grid_settings(spec, tokenizer))
    if failures:
        raise OnnxImportError(failures, str(source))
    return graph


def import_reranker(
    source: Path, repo: Path, spec: RerankSpec, threads: int = 1
) -> tuple[ImportedGraph, list[str]]:
    """:func:`verify_reranker`, then write the graph and tokenizer to
    ``repo/<spec.encoder_model>/1/`` atomically with sidecars; ``(graph, paths written)``."""
    graph = verify_reranker(source, spec, threads)
    files = {MODEL_FILE: source / MODEL_FILE, TOKENIZER_FILE: source / TOKENIZER_FILE}
    return graph, write_model(repo, spec.encoder_model, files, renames=axis_renames(graph))


class OrtReranker:
    """In-process reference: ``spec``'s pair tokenizer and ONNX Runtime on ``directory``'s
    ``model.onnx``, run the way the project's onnxruntime backend runs a merged batch
    (``tritonforge.batching``): each row alone at its unpadded length when the graph quantizes
    activations per tensor at run time (dynamic int8, ``spec.batch_rows`` ``auto``), else the
    batch cut to its longest row. :meth:`logits` scores the N documents of one query."""

    def __init__(self, directory: Path, spec: RerankSpec, threads: int = 1) -> None:
        import onnxruntime as ort

        path = directory / MODEL_FILE
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.log_severity_level = 3
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        names = [i.name for i in self.session.get_inputs()]
        self.tokenizer = PairTokenizer(
            directory / TOKENIZER_FILE, spec.max_length, spec.truncation, outputs=names
        )
        self.output = self.session.get_outputs()[0].name
        self.axis_names: AxisNames = {
            t.name: [d if isinstance(d, str) else None for d in t.shape]
            for t in [*self.session.get_inputs(), *self.session.get_outputs()]
        }
        self.pad_values = {n: self.tokenizer.pad_id if n == "input_ids" else 0 for n in names}
        self.rows_alone = rows_alone(path, spec.batch_rows)

    def _run(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        (out,) = self.session.run([self.output], feed)
        return {self.output: out}

    def logits(self, query: str, documents: Sequence[str]) -> tuple[np.ndarray, int]:
        """float32 ``[n]`` logits of the pairs, and the tokens they took (the usage figure)."""
        tokens = self.tokenizer.encode(query, documents)
        infer = infer_rows if self.rows_alone else infer_trimmed
        out = infer(tokens, self._run, self.pad_values, self.axis_names)
        return pair_logits(out[self.output]), input_tokens(tokens)

    def rerank(
        self, query: str, documents: Sequence[str], top_n: int | None = None
    ) -> list[Ranked]:
        """The ranked results as the served pipeline must answer them."""
        raw, _ = self.logits(query, documents)
        scores = sigmoid(raw)
        return ranked(scores, raw, ranking(scores, top_n))


class _LogitsOnly(torch.nn.Module):
    """A Hugging Face sequence classifier answering its ``logits`` tensor only."""

    def __init__(self, model: torch.nn.Module, names: Sequence[str]) -> None:
        super().__init__()
        self.model = model
        self.names = tuple(names)

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return self.model(**dict(zip(self.names, tensors, strict=True))).logits


def load_cross_encoder(checkpoint: Path) -> tuple[torch.nn.Module, list[str]]:
    """The checkpoint's 1-label sequence classifier (eval mode) and the token inputs its
    ``forward`` takes, in :data:`TOKENIZER_OUTPUTS` order; :class:`ExportError` otherwise."""
    import inspect

    from transformers import AutoModelForSequenceClassification

    try:
        model = AutoModelForSequenceClassification.from_pretrained(checkpoint).eval()
    except (OSError, ValueError) as e:
        raise ExportError(f"{checkpoint} is not a loadable sequence classifier: {e}") from e
    if model.config.num_labels != 1:
        raise ExportError(
            f"{checkpoint} has {model.config.num_labels} labels; a cross-encoder has exactly 1"
        )
    accepted = inspect.signature(model.forward).parameters
    return model, [n for n in TOKENIZER_OUTPUTS if n in accepted]


def pretrained_parity_failures(
    checkpoint: Path, directory: Path, spec: RerankSpec, atol: float = 1e-4
) -> list[str]:
    """The exported graph in ``directory`` against PyTorch eager on the import grid's shapes
    and its padded batch (the ``--from-pretrained`` path keeps its PyTorch reference): every
    logit within ``atol``. Returns the failures (empty = equal)."""
    model, _ = load_cross_encoder(checkpoint)
    graph = inspect_graph(directory / MODEL_FILE)
    settings = grid_settings(spec, directory / TOKENIZER_FILE)
    run = ort_runner(graph.path, threads=1)
    rng = np.random.default_rng(settings.seed)
    decl = TensorDecl("logits", "float32", ("batch_size", 1), atol=atol)
    failures = []
    shapes = [[n] * b for b, n in settings.shapes] + [list(settings.mixed_lengths)]
    for lengths in shapes:
        feed = token_inputs(graph, lengths, rng, settings)
        with torch.inference_mode():
            want = model(**{k: torch.from_numpy(v) for k, v in feed.items()}).logits.numpy()
        label = f"PyTorch vs ONNX, lengths {lengths[0]}..{lengths[-1]} x{len(lengths)}"
        failures += compare_outputs([decl], label, run(feed), {"logits": want})[1]
    return failures


def verify_pretrained(checkpoint: Path, out: Path, spec: RerankSpec) -> ImportedGraph:
    """:func:`export_pretrained` into ``out``, :func:`verify_reranker` on it, and PyTorch
    parity (:func:`pretrained_parity_failures`); one :class:`OnnxImportError` lists every
    failure. ``out`` is then what :func:`import_reranker` takes."""
    export_pretrained(checkpoint, out)
    graph = verify_reranker(out, spec)
    failures = pretrained_parity_failures(checkpoint, out, spec)
    if failures:
        raise OnnxImportError(failures, str(checkpoint))
    return graph


def export_pretrained(checkpoint: Path, out: Path, opset: int = 17) -> Path:
    """Export a Hugging Face cross-encoder checkpoint (a sequence classifier with one label)
    to ``out/model.onnx`` with named ``batch_size``/``sequence`` axes, and copy its
    tokenizer.json beside it: the directory :func:`verify_reranker` takes (the
    ``--from-pretrained --task rerank`` path). Raises :class:`ExportError` naming the problem."""
    model, names = load_cross_encoder(checkpoint)
    out.mkdir(parents=True, exist_ok=True)
    axes = {"batch_size": 0, "sequence": 1}
    example = tuple(torch.ones((2, 5), dtype=torch.int64) for _ in names)
    torch_to_onnx(
        _LogitsOnly(model, names),
        example,
        out / MODEL_FILE,
        (names, ["logits"]),
        {
            **{n: {i: a for a, i in axes.items()} for n in names},
            "logits": {0: "batch_size"},
        },
        opset,
        f"cross-encoder {checkpoint}",
        no_grad=True,
    )
    shutil.copyfile(checkpoint / TOKENIZER_FILE, out / TOKENIZER_FILE)
    return out
