"""The skew report (tritonforge/tasks/image/loadtest.py): an OpenCV INTER_LINEAR resize feeds the
model other pixels than the Pillow resize it was trained with, and the report counts what that
changes; where no resize happens the two paths agree exactly."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from tritonforge.tasks.image.loadtest import encoded_views, opencv_pixels, skew_report
from tritonforge.tasks.image.preprocessing import EFFICIENTNET_LITE, ImagePreprocessing
from tritonforge.tasks.image.samples import sample_photos
from tritonforge.tasks.image.transforms import preprocess


def png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def test_opencv_linear_differs_from_the_trained_resize_on_a_downscaled_photo() -> None:
    data = sample_photos()["coffee"].read_bytes()
    spec = EFFICIENTNET_LITE
    levels = np.abs(preprocess(data, spec) - opencv_pixels(data, spec)) * 128  # std = 128 / 255
    assert levels.max() > 10 and levels.mean() > 0.5


def test_without_a_resize_both_paths_agree_exactly() -> None:
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (224, 224, 3), dtype=np.uint8), "RGB")
    spec = ImagePreprocessing(
        resize=(224,), crop=(224, 224), mean=EFFICIENTNET_LITE.mean, std=EFFICIENTNET_LITE.std
    )
    assert np.array_equal(preprocess(png(image), spec), opencv_pixels(png(image), spec))


def test_the_report_counts_changed_answers() -> None:
    photos = {k: v for k, v in sample_photos().items() if k in ("coffee", "rocket")}
    items = encoded_views(photos)
    assert [name for name, _ in items][:2] == ["coffee#0", "coffee#1"] and len(items) == 8
    weights = np.random.default_rng(0).standard_normal((3 * 224 * 224, 10)).astype(np.float32)

    def linear(x: np.ndarray) -> np.ndarray:
        return x.reshape(len(x), -1) @ weights / 100

    report = skew_report(linear, items)
    assert report["images"] == 8 and 0.0 <= report["top1_agreement"] <= 1.0
    assert report["pixel_levels_max"] > 10
    assert len(report["top1_changed"]) == round(8 * (1 - report["top1_agreement"]))
