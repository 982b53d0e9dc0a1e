"""The served image preprocessing (tritonforge/tasks/image/transforms.py) on every case of issue
#32's "bad and hostile images" list, each image made here with Pillow; and the declaration's
round trip through config parameters."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from tritonforge.errors import InvalidInputError, ModelConfigError
from tritonforge.tasks.image.errors import ImageDecodeError, ImageError, ImageTooLargeError
from tritonforge.tasks.image.preprocessing import EFFICIENTNET_LITE, ImagePreprocessing
from tritonforge.tasks.image.transforms import (
    convert,
    crop,
    decode,
    normalise,
    preprocess,
    preprocess_batch,
    request_pixels,
    resize,
)

SPEC = EFFICIENTNET_LITE
SPEC_IMAGENET = ImagePreprocessing()


def encoded(image: Image.Image, fmt: str, **save: object) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **save)
    return buf.getvalue()


def gradient(width: int = 64, height: int = 48) -> Image.Image:
    x = np.linspace(0, 255, width, dtype=np.float32)[None, :].repeat(height, 0)
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None].repeat(width, 1)
    return Image.fromarray(np.stack([x, y, 255 - x], axis=-1).astype(np.uint8), "RGB")


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header declares ``width`` x ``height`` with a few bytes of data (a bomb)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


def test_a_jpeg_becomes_the_declared_tensor() -> None:
    out = preprocess(encoded(gradient(), "JPEG", quality=95), SPEC)
    assert out.shape == (3, 224, 224) and out.dtype == np.float32
    assert out.min() >= -1.0 and out.max() <= 1.0  # (x - 127) / 128 of uint8


def test_png_alpha_is_composited_over_the_background_or_dropped_as_declared() -> None:
    rgba = Image.new("RGBA", (32, 32), (255, 0, 0, 0))  # fully transparent red
    data = encoded(rgba, "PNG")
    composited = preprocess(data, SPEC)  # white background
    assert np.allclose(composited, (1.0 - 127 / 255) / (128 / 255), atol=1e-6)
    dropped = preprocess(data, ImagePreprocessing(**{**SPEC.__dict__, "alpha": "drop"}))
    assert dropped[0].max() > 0.9 and dropped[1].max() < -0.9  # the hidden red shows


def test_grayscale_and_palette_become_rgb() -> None:
    gray = preprocess(encoded(gradient().convert("L"), "PNG"), SPEC)
    assert gray.shape == (3, 224, 224) and np.array_equal(gray[0], gray[2])
    palette = gradient().convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    assert preprocess(encoded(palette, "PNG"), SPEC).shape == (3, 224, 224)
    transparent = Image.new("P", (8, 8), 0)
    transparent.putpalette([0, 0, 0] * 256)
    out = preprocess(encoded(transparent, "PNG", transparency=0), SPEC)  # composited: white
    assert np.allclose(out, (1.0 - 127 / 255) / (128 / 255), atol=1e-6)


def test_a_grayscale_model_gets_one_channel() -> None:
    spec = ImagePreprocessing(color_mode="L", mean=(0.5,), std=(0.5,), resize=(32,), crop=(28, 28))
    assert preprocess(encoded(gradient(), "PNG"), spec).shape == (1, 28, 28)


def test_cmyk_jpeg_converts_like_pillow() -> None:
    cmyk = gradient().convert("CMYK")
    data = encoded(cmyk, "JPEG", quality=100)
    assert Image.open(io.BytesIO(data)).mode == "CMYK"
    want = gradient().resize((298, 224), Image.BILINEAR)  # 64x48 -> short side 256 ...
    got = preprocess(
        data, ImagePreprocessing(resize=(224,), crop=None, mean=(0, 0, 0), std=(1, 1, 1))
    )
    assert got.shape == (3, 224, 298)
    assert np.abs(got.transpose(1, 2, 0) * 255 - np.asarray(want, np.float32)).mean() < 8


def test_the_exif_orientation_is_applied() -> None:
    tall = Image.new("RGB", (20, 40), (0, 0, 255))
    tall.paste((255, 0, 0), (0, 0, 20, 20))  # red on top
    exif = Image.Exif()
    exif[0x0112] = 6  # the viewer rotates 90 degrees clockwise: red ends on the right
    data = encoded(tall, "JPEG", exif=exif.tobytes(), quality=100)
    assert decode(data, SPEC).size == (20, 40)  # as stored; orient() turns it
    out = preprocess(
        data, ImagePreprocessing(resize=(20, 40), crop=None, mean=(0, 0, 0), std=(1, 1, 1))
    )
    assert out.shape == (3, 20, 40)  # landscape now
    assert out[0, :, 30:].mean() > 0.9 and out[0, :, :10].mean() < 0.1
    ignored = ImagePreprocessing(resize=(20, 40), crop=None, exif_orientation=False)
    assert preprocess(data, ignored).shape == (3, 20, 40)  # stretched, but as declared


def test_a_one_pixel_image_is_resized_and_cropped() -> None:
    out = preprocess(encoded(Image.new("RGB", (1, 1), (127, 127, 127)), "PNG"), SPEC)
    assert out.shape == (3, 224, 224) and np.allclose(out, 0.0, atol=1e-6)


def test_a_decompression_bomb_is_refused_before_decoding() -> None:
    with pytest.raises(ImageTooLargeError, match=r"image\[3\]: 8000x6000 = .* over the limit"):
        decode(png_header_only(8000, 6000), SPEC, index=3)
    with pytest.raises(ImageTooLargeError, match=r"image\[2\]: decompression bomb refused"):
        decode(png_header_only(100_000, 100_000), SPEC, index=2)  # past Pillow's own bound
    small_limit = ImagePreprocessing(max_pixels=1000)
    with pytest.raises(ImageTooLargeError, match="pixels, over the limit of 1000"):
        preprocess(encoded(gradient(), "PNG"), small_limit)


def test_an_extreme_aspect_ratio_is_refused_before_resizing() -> None:
    with pytest.raises(ImageTooLargeError, match="aspect ratio too extreme"):
        preprocess(encoded(Image.new("RGB", (100_000, 1)), "PNG"), SPEC)


def test_too_many_bytes_are_refused() -> None:
    with pytest.raises(ImageTooLargeError, match="over the limit of 100"):
        decode(encoded(gradient(), "PNG"), ImagePreprocessing(max_bytes=100))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "0 bytes"),
        (b"%PDF-1.7 not an image at all", "not an image of an accepted format"),
        (b"\x89PNG\r\n\x1a\n", "not an image|unreadable"),
    ],
    ids=["zero-bytes", "non-image", "png-signature-only"],
)
def test_empty_and_non_image_bytes_are_refused(data: bytes, message: str) -> None:
    with pytest.raises(ImageDecodeError, match=message):
        preprocess(data, SPEC, index=7)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_truncated_data_is_refused(fmt: str) -> None:
    data = encoded(gradient(256, 256), fmt)
    with pytest.raises(ImageDecodeError, match=r"image\[0\]: .*(truncated|corrupt)"):
        preprocess(data[: len(data) // 2], SPEC)


def test_a_format_not_declared_is_refused() -> None:
    data = encoded(gradient(), "PNG")
    with pytest.raises(ImageDecodeError, match="accepted format"):
        preprocess(data, ImagePreprocessing(formats=("JPEG",)))


def test_a_batch_answers_the_good_items_and_names_each_bad_one() -> None:
    good = encoded(gradient(), "JPEG")
    items = [good, b"", good, b"garbage", png_header_only(50_000, 50_000), good]
    batch = preprocess_batch(items, SPEC)
    assert batch.indices == [0, 2, 5]
    assert batch.pixels.shape == (3, 3, 224, 224)
    assert [e.index for e in batch.errors] == [1, 3, 4]
    assert [type(e) for e in batch.errors] == [
        ImageDecodeError,
        ImageDecodeError,
        ImageTooLargeError,
    ]
    assert all(isinstance(e, InvalidInputError) and e.code == "INVALID_ARG" for e in batch.errors)
    assert str(batch.errors[0]).startswith("image[1]: ")
    assert np.array_equal(batch.pixels[0], preprocess(good, SPEC))


def test_one_request_is_checked_once_for_every_image_stage() -> None:
    """request_pixels: what the preprocess stage and the BLS both check (the input is there, at
    most max_items images, each decodes), naming the field or the bad image."""
    good = encoded(gradient(), "JPEG")
    rows = np.array([[good], [good]], dtype=np.object_)
    assert request_pixels(rows, "image", 2, SPEC).shape == (2, 3, 224, 224)
    with pytest.raises(InvalidInputError, match="input 'image' is required"):
        request_pixels(None, "image", 2, SPEC)
    with pytest.raises(InvalidInputError, match="'image': 2 images, at most 1 a request"):
        request_pixels(rows, "image", 1, SPEC)
    with pytest.raises(InvalidInputError, match=r"image\[1\]"):
        request_pixels(np.array([good, b"garbage"], dtype=np.object_), "image", 2, SPEC)


def test_no_image_stage_restates_the_request_checks() -> None:
    from tritonforge import tasks

    image = tasks.get("image")
    for kind in ("image_preprocess", "image_bls"):  # the stages that take the images
        text = image.stage_source(kind).read_text()
        assert "request_pixels(" in text and "images, at most" not in text, kind


def test_an_all_bad_batch_has_an_empty_tensor_of_the_declared_shape() -> None:
    batch = preprocess_batch([b""], SPEC)
    assert batch.pixels.shape == (0, 3, 224, 224) and len(batch.errors) == 1


def test_without_a_fixed_size_items_of_another_size_are_refused() -> None:
    spec = ImagePreprocessing(resize=(32,), crop=None)
    batch = preprocess_batch(
        [encoded(gradient(64, 48), "PNG"), encoded(gradient(48, 64), "PNG")], spec
    )
    assert batch.indices == [0] and isinstance(batch.errors[0], ImageError)
    assert "declare a crop" in str(batch.errors[0])


def test_nhwc_layout_and_steps_compose() -> None:
    spec = ImagePreprocessing(layout="NHWC")
    image = convert(gradient(), spec)
    out = normalise(crop(resize(image, spec), spec), spec)
    assert out.shape == (224, 224, 3)
    assert np.array_equal(
        out.transpose(2, 0, 1), preprocess(encoded(gradient(), "PNG"), SPEC_IMAGENET)
    )


def test_crop_pads_with_zeros_when_the_image_is_smaller() -> None:
    spec = ImagePreprocessing(resize=(10, 10), crop=(12, 12))
    out = crop(Image.new("RGB", (10, 10), (255, 255, 255)), spec)
    assert out.size == (12, 12)
    pixels = np.asarray(out)
    assert pixels[0].max() == 0 and pixels[1, 1].min() == 255


def test_the_declaration_round_trips_through_config_parameters() -> None:
    params = SPEC.to_parameters()
    assert all(k.startswith("image.") for k in params)
    assert ImagePreprocessing.from_parameters(params) == SPEC
    assert ImagePreprocessing.from_parameters({}) == ImagePreprocessing()
    with pytest.raises(ModelConfigError, match=r"image\.crop"):
        ImagePreprocessing.from_parameters({"image.crop": "[224"})
    with pytest.raises(ModelConfigError, match="interpolation"):
        ImagePreprocessing.from_parameters({"image.interpolation": '"cubic"'})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"antialias": False}, "Pillow always antialiases"),
        ({"mean": (0.5,)}, "mean/std need 3"),
        ({"std": (0.0, 1.0, 1.0)}, "every value > 0"),
        ({"crop": (224,)}, "crop"),
        ({"layout": "CHW"}, "layout"),
    ],
)
def test_an_inconsistent_declaration_is_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ModelConfigError, match=message):
        ImagePreprocessing(**fields)  # type: ignore[arg-type]
