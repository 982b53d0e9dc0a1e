"""The training-side reference: torchvision's transforms on PIL images, as Pillow calls.

torchvision's CUDA wheel on PyPI cannot load beside the CPU torch here (its ``_C.so`` needs
``libc10_cuda.so``: "operator torchvision::nms does not exist"), so this module transcribes what
torchvision 0.28's PIL path calls, line for line (``transforms/functional.py`` and
``transforms/v2/functional/_geometry.py``):

- ``Resize(size)`` -> ``_compute_resized_output_size`` then ``_functional_pil.resize`` =
  ``img.resize((w, h), interpolation)``: Pillow's default ``reducing_gap=None``, and Pillow always
  antialiases (``antialias`` is ignored for PIL images);
- ``CenterCrop`` -> ``crop_top = int(round((h - ch) / 2.0))`` (same for left), ``img.crop``;
- ``ToTensor`` -> ``uint8 HWC / 255`` as ``CHW`` float32; ``Normalize`` -> ``(x - mean) / std``.

It is written apart from :mod:`.transforms` on purpose: the parity test compares the two.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from tritonforge.tasks.image.preprocessing import ImagePreprocessing

_PIL_FILTERS = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
    "lanczos": Image.Resampling.LANCZOS,
}


def torchvision_resize(img: Image.Image, size: tuple[int, ...], interpolation: str) -> Image.Image:
    """``torchvision.transforms.functional.resize`` on a PIL image."""
    w, h = img.size
    if len(size) == 1:
        short, long = (w, h) if w <= h else (h, w)
        new_short, new_long = size[0], int(size[0] * long / short)
        new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
    else:
        new_h, new_w = size
    return img.resize((new_w, new_h), _PIL_FILTERS[interpolation])


def torchvision_center_crop(img: Image.Image, output_size: tuple[int, int]) -> Image.Image:
    """``torchvision.transforms.functional.center_crop`` on a PIL image (no padding case)."""
    crop_height, crop_width = output_size
    image_width, image_height = img.size
    if crop_width > image_width or crop_height > image_height:
        raise ValueError("the reference covers crops inside the image only")
    crop_top = round((image_height - crop_height) / 2.0)
    crop_left = round((image_width - crop_width) / 2.0)
    return img.crop((crop_left, crop_top, crop_left + crop_width, crop_top + crop_height))


def to_tensor_normalize(
    img: Image.Image, mean: tuple[float, ...], std: tuple[float, ...]
) -> np.ndarray:
    """``ToTensor()`` then ``Normalize(mean, std)``: float32 ``CHW``."""
    x = np.asarray(img, dtype=np.uint8)
    if x.ndim == 2:
        x = x[:, :, None]
    chw = x.transpose(2, 0, 1).astype(np.float32) / 255.0
    m = np.asarray(mean, dtype=np.float32)[:, None, None]
    s = np.asarray(std, dtype=np.float32)[:, None, None]
    return ((chw - m) / s).astype(np.float32)


def reference_pixels(source: Path | bytes, spec: ImagePreprocessing) -> np.ndarray:
    """What a training script feeds the model for the file at ``source`` (a path, or its bytes):
    ``Image.open(...).convert(mode)`` then the declared Resize, CenterCrop, ToTensor, Normalize
    (``CHW``)."""
    with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as opened:
        img = opened.convert(spec.color_mode)
    img = torchvision_resize(img, spec.resize, spec.interpolation)
    if spec.crop is not None:
        img = torchvision_center_crop(img, spec.crop)
    return to_tensor_normalize(img, spec.mean, spec.std)


def pixel_skew(served: np.ndarray, reference: np.ndarray, spec: ImagePreprocessing) -> float:
    """Largest difference between two ``CHW`` normalised tensors, in ``[0, 1]`` pixel units
    (undoing ``std``): the parity check's bound is ``1 / 255`` (one 8-bit level)."""
    if served.shape != reference.shape:
        raise ValueError(f"shapes differ: served {served.shape}, reference {reference.shape}")
    std = np.asarray(spec.std, dtype=np.float64)[:, None, None]
    return float((np.abs(served.astype(np.float64) - reference) * std).max(initial=0.0))
