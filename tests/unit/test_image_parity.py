"""The training/serving skew check of issue #32: the served preprocessing (bytes in, as the stage
gets them) equals the torchvision reference (a training script's ``Image.open(path).convert``,
Resize, CenterCrop, ToTensor, Normalize) within one 8-bit level per pixel on every sample photo."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from tritonforge.tasks.image.preprocessing import EFFICIENTNET_LITE, ImagePreprocessing
from tritonforge.tasks.image.reference import pixel_skew, reference_pixels
from tritonforge.tasks.image.samples import imagenet_labels, sample_photos
from tritonforge.tasks.image.transforms import preprocess

PHOTOS = sample_photos()
ONE_LEVEL = 1 / 255


@pytest.mark.parametrize("name", sorted(PHOTOS))
@pytest.mark.parametrize(
    "spec",
    [EFFICIENTNET_LITE, ImagePreprocessing(), ImagePreprocessing(resize=(160, 200), crop=None)],
    ids=["efficientnet-lite", "imagenet-default", "fixed-size-no-crop"],
)
def test_served_preprocessing_equals_the_torchvision_reference(
    name: str, spec: ImagePreprocessing
) -> None:
    served = preprocess(PHOTOS[name].read_bytes(), spec)
    assert pixel_skew(served, reference_pixels(PHOTOS[name], spec), spec) <= ONE_LEVEL


def test_the_check_sees_a_mismatched_resize() -> None:
    """The bound is not loose: a resize without antialiasing (what OpenCV's INTER_LINEAR does)
    is far more than one level off on a downscaled photo."""
    path = PHOTOS["coffee"]
    spec = EFFICIENTNET_LITE
    with Image.open(path) as img:
        w, h = img.size
        new = (int(spec.resize[0] * w / h), spec.resize[0])
        nearest = img.convert("RGB").resize(new, Image.NEAREST)
    top, left = (new[1] - 224) // 2, (new[0] - 224) // 2
    arr = np.asarray(nearest.crop((left, top, left + 224, top + 224)), dtype=np.float32) / 255
    mismatched = ((arr - np.float32(127 / 255)) / np.float32(128 / 255)).transpose(2, 0, 1)
    assert pixel_skew(mismatched, reference_pixels(path, spec), spec) > 10 * ONE_LEVEL


def test_the_sample_photos_and_labels_come_from_installed_packages() -> None:
    assert {"coffee", "chelsea", "astronaut", "rocket", "grace_hopper"} <= set(PHOTOS)
    labels = imagenet_labels()
    assert labels[0] == "tench" and len(set(labels)) == 1000
