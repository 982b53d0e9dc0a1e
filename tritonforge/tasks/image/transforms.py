"""The served image preprocessing as pure functions (Pillow + numpy; they run in Triton's stub).

``bytes`` --:func:`decode`--> ``Image`` --:func:`orient`--> --:func:`convert`--> --:func:`resize`-->
--:func:`crop`--> --:func:`normalise`--> ``float32`` array; :func:`preprocess` chains them for one
item, :func:`preprocess_batch` for a request's items: a bad item becomes an :class:`ImageError`
naming its index while the others are still preprocessed. Every step follows the declaration in
:class:`ImagePreprocessing`; torchvision's PIL path is the contract (:mod:`.reference`).
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from tritonforge.errors import InvalidInputError
from tritonforge.tasks.image.errors import ImageDecodeError, ImageError, ImageTooLargeError
from tritonforge.tasks.image.preprocessing import ImagePreprocessing

FILTERS = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
    "lanczos": Image.Resampling.LANCZOS,
}
ALPHA_IMAGE_MODES = ("RGBA", "LA", "PA", "RGBa", "La")


def decode(data: bytes, spec: ImagePreprocessing, index: int = 0) -> Image.Image:
    """Open ``data`` as one of ``spec.formats`` and decode its pixels (the first frame).

    Refused before decoding: 0 bytes, more than ``max_bytes``, a header declaring more than
    ``max_pixels`` (decompression bomb). Refused while decoding: truncated or corrupt data.
    """
    if not data:
        raise ImageDecodeError(index, "0 bytes; send the image file's bytes")
    if len(data) > spec.max_bytes:
        raise ImageTooLargeError(index, f"{len(data)} bytes, over the limit of {spec.max_bytes}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=list(spec.formats))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageTooLargeError(
            index, f"decompression bomb refused (the limit is {spec.max_pixels} pixels): {e}"
        ) from e
    except UnidentifiedImageError as e:
        raise ImageDecodeError(
            index, f"not an image of an accepted format ({', '.join(spec.formats)})"
        ) from e
    except (OSError, ValueError, SyntaxError, EOFError) as e:
        raise ImageDecodeError(index, f"unreadable image header: {e}") from e
    width, height = image.size
    if width * height > spec.max_pixels:
        raise ImageTooLargeError(
            index,
            f"{width}x{height} = {width * height} pixels, over the limit of {spec.max_pixels} "
            "(a decompression bomb?)",
        )
    try:
        image.load()
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        raise ImageDecodeError(index, f"{image.format} data is truncated or corrupt: {e}") from e
    return image


def orient(image: Image.Image, spec: ImagePreprocessing, index: int = 0) -> Image.Image:
    """Apply the EXIF orientation tag (when declared): the pixels as the camera's viewer shows
    them."""
    if not spec.exif_orientation:
        return image
    try:
        return ImageOps.exif_transpose(image)
    except (OSError, SyntaxError, ValueError, KeyError, TypeError) as e:
        raise ImageDecodeError(index, f"unreadable EXIF orientation: {e}") from e


def convert(image: Image.Image, spec: ImagePreprocessing) -> Image.Image:
    """To ``spec.color_mode``: grayscale, palette, CMYK, 16-bit and the rest through Pillow's
    conversions (as ``Image.convert`` in a training script); transparency composited over ``spec.background`` or dropped, as declared."""
    has_alpha = image.mode in ALPHA_IMAGE_MODES or (
        image.mode == "P" and "transparency" in image.info
    )
    if has_alpha and spec.alpha == "composite":
        rgba = image.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, (*spec.background, 255))
        image = Image.alpha_composite(canvas, rgba)
    return image if image.mode == spec.color_mode else image.convert(spec.color_mode)


def resized_size(width: int, height: int, spec: ImagePreprocessing) -> tuple[int, int]:
    """``(width, height)`` after ``spec.resize`` (torchvision's ``_compute_resized_output_size``)."""
    if len(spec.resize) == 2:
        return spec.resize[1], spec.resize[0]
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = spec.resize[0], int(spec.resize[0] * long / short)
    return (new_short, new_long) if width <= height else (new_long, new_short)


def resize(image: Image.Image, spec: ImagePreprocessing, index: int = 0) -> Image.Image:
    """Resize as declared (Pillow's antialiased filters, ``reducing_gap=None``: what torchvision
    calls on PIL images); a size over ``max_pixels`` (an extreme aspect ratio) is refused."""
    width, height = resized_size(*image.size, spec)
    if width * height > spec.max_pixels:
        raise ImageTooLargeError(
            index,
            f"{image.width}x{image.height} resizes to {width}x{height}, over the limit of "
            f"{spec.max_pixels} pixels (aspect ratio too extreme)",
        )
    if (width, height) == image.size:
        return image
    return image.resize((width, height), FILTERS[spec.interpolation], reducing_gap=None)


def crop(image: Image.Image, spec: ImagePreprocessing) -> Image.Image:
    """The centre ``spec.crop`` (torchvision ``CenterCrop``: zero padding when smaller)."""
    if spec.crop is None:
        return image
    crop_h, crop_w = spec.crop
    if crop_w > image.width or crop_h > image.height:
        padded = Image.new(image.mode, (max(crop_w, image.width), max(crop_h, image.height)))
        left = (crop_w - image.width) // 2 if crop_w > image.width else 0
        top = (crop_h - image.height) // 2 if crop_h > image.height else 0
        padded.paste(image, (left, top))
        image = padded
    top = round((image.height - crop_h) / 2.0)
    left = round((image.width - crop_w) / 2.0)
    return image.crop((left, top, left + crop_w, top + crop_h))


def normalise(image: Image.Image, spec: ImagePreprocessing) -> np.ndarray:
    """Pixels -> float32 ``(x / 255 - mean) / std`` per channel, in ``spec.layout`` (no batch
    axis)."""
    pixels = np.asarray(image, dtype=np.float32).reshape(image.height, image.width, spec.channels)
    mean = np.asarray(spec.mean, dtype=np.float32)
    std = np.asarray(spec.std, dtype=np.float32)
    out = (pixels / np.float32(255.0) - mean) / std
    if spec.layout == "NCHW":
        out = out.transpose(2, 0, 1)
    return np.ascontiguousarray(out, dtype=np.float32)


def preprocess(data: bytes, spec: ImagePreprocessing, index: int = 0) -> np.ndarray:
    """One encoded image -> the model's input row; :class:`ImageError` naming ``index``."""
    image = orient(decode(data, spec, index), spec, index)
    try:
        image = convert(image, spec)
    except (OSError, ValueError) as e:
        raise ImageDecodeError(index, f"cannot convert mode {image.mode} to RGB: {e}") from e
    return normalise(crop(resize(image, spec, index), spec), spec)


@dataclass
class Batch:
    """A request's items after :func:`preprocess_batch`: ``pixels`` stacks the good ones
    (``indices``, request order), ``errors`` holds one per refused item."""

    pixels: np.ndarray
    indices: list[int] = field(default_factory=list)
    errors: list[ImageError] = field(default_factory=list)

    def check(self) -> np.ndarray:
        """``pixels`` when every item was accepted; else one :class:`InvalidInputError` naming
        each refused item (a request is answered whole: the stage refuses it with this)."""
        if not self.errors:
            return self.pixels
        total = len(self.indices) + len(self.errors)
        raise InvalidInputError(
            f"{len(self.errors)} of {total} image(s) refused: "
            + "; ".join(str(e) for e in self.errors)
        )


def preprocess_batch(items: Sequence[bytes], spec: ImagePreprocessing) -> Batch:
    """Preprocess every item; a bad one is recorded, never raised, and never stops the others.

    Without a fixed output size (``crop`` and a ``(h, w)`` resize both absent) the items must
    come out the same size to be stacked; one that does not is refused naming both sizes.
    """
    rows: list[np.ndarray] = []
    batch = Batch(np.zeros((0, *[max(d, 0) for d in spec.output_shape()]), dtype=np.float32))
    for i, data in enumerate(items):
        try:
            row = preprocess(bytes(data), spec, i)
            if rows and row.shape != rows[0].shape:
                raise ImageError(
                    i, f"size {row.shape} differs from {rows[0].shape}; declare a crop"
                )
        except ImageError as e:
            batch.errors.append(e)
            continue
        rows.append(row)
        batch.indices.append(i)
    if rows:
        batch.pixels = np.stack(rows)
    return batch


def request_pixels(
    items: np.ndarray | None, field: str, max_items: int, spec: ImagePreprocessing
) -> np.ndarray:
    """One request's pixels, checked as every image stage checks them: ``items`` (the input
    tensor's array, None when the request lacks it) must be there with at most ``max_items``
    images, each one decoding; else :class:`InvalidInputError` naming ``field`` (or every bad
    image)."""
    if items is None:
        raise InvalidInputError(f"input {field!r} is required")
    rows = list(items.reshape(-1))
    if len(rows) > max_items:
        raise InvalidInputError(f"{field!r}: {len(rows)} images, at most {max_items} a request")
    return preprocess_batch(rows, spec).check()
