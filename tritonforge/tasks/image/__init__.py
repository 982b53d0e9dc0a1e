"""Image classification (issue #32): a CNN behind a preprocessing stage verified against the
training transforms (docs/images.md).

By layer (the module name says the layer, docs/architecture.md "Layers"):

- core: :mod:`.spec` (:class:`ImageSpec`, the default ``EFFICIENTNET_LITE0``: model, labels,
  served names), :mod:`.preprocessing` (:class:`ImagePreprocessing`, ``EFFICIENTNET_LITE``),
  :mod:`.transforms` (the served preprocessing, Pillow + numpy), :mod:`.reference`
  (torchvision's PIL path, transcribed), :mod:`.samples` (photos and ImageNet names from PyPI
  packages), :mod:`.errors`;
- stages: ``stages/preprocess_model.py`` (BYTES -> pixels), ``stages/postprocess_model.py``
  (logits -> softmax, top-k with labels), ``stages/bls_model.py`` (the three in one);
- export: ``export/graph.py`` (CNN -> verified ONNX/TorchScript), ``export/configs.py`` (every
  config, generated from the spec), ``export/run.py`` (``tritonforge export efficientnet_lite0``,
  ``--from-pretrained DIR --task image``), ``export/int8.py`` (does int8 pay? measured: no);
- client: ``client.py`` (``.classify_image``, ``tritonforge client classify-image``, the demo);
- loadtest: ``loadtest.py`` (the OpenCV-resize skew report, the Locust user, the bench cell).

Registered as a task of its own kind (like rerank): its export module exports it.
"""

from tritonforge.tasks import Task
from tritonforge.tasks.image.spec import TASK as NAME

IMAGE_CLASSIFIER = "image_classifier"
TASK = Task(
    NAME,
    __name__,
    kind=IMAGE_CLASSIFIER,
    labels=True,
    stages={
        "image_preprocess": "preprocess_model.py",
        "image_postprocess": "postprocess_model.py",
        "image_bls": "bls_model.py",
    },
    export_sources=("tasks/image",),
    client_call="classify_image",
)
