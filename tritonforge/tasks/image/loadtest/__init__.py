"""Training/serving skew, measured: what a serving-side resize that differs from training's does
to the answers (issue #32; the figure is in docs/images.md).

The served preprocessing resizes like torchvision on PIL (antialiased bilinear); a server that
decodes and resizes with OpenCV (``cv2.imdecode`` + ``cv2.resize(INTER_LINEAR)``, no antialias)
feeds the same model other pixels. :func:`skew_report` runs both on the sample photos (each also
mirrored and cropped to 80% and 60%, for more rows) and reports how often the top-1 class
agrees, the top-5 overlap, and how far probabilities and pixels move.

    python -m tritonforge.tasks.image.loadtest          # the report as JSON (EfficientNet-Lite0)

The task's load tests live beside it: its Locust users (:data:`LOCUSTFILE`, :data:`USERS` by
protocol), its bench cell (:mod:`.bench`: images/s served vs in-process) and what ``make perf``
sends (:func:`perf_items`: photos).
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from tritonforge.classify import softmax
from tritonforge.tasks.image.export.int8 import views
from tritonforge.tasks.image.preprocessing import EFFICIENTNET_LITE, ImagePreprocessing
from tritonforge.tasks.image.transforms import crop, normalise, preprocess, resized_size

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
USERS = {
    "http": ["ImageHttpUser"],
    "grpc": ["ImageGrpcUser"],
    "both": ["ImageHttpUser", "ImageGrpcUser"],
}

# make perf's photos (perf_analyzer input data): the sample photos up to this size, so that the
# input file stays small (each one is in it, base64)
PERF_MAX_PHOTO_BYTES = 256 * 1024


def bench_section(client: Any, repository: Path) -> list[dict[str, Any]]:
    """``make bench``'s image section: :func:`.bench.bench_section`."""
    from tritonforge.tasks.image.loadtest.bench import bench_section as run

    return run(client, repository)


def perf_items() -> list[bytes]:
    """What ``make perf`` sends as this task's BYTES inputs: encoded sample photos (the smaller
    ones: :data:`PERF_MAX_PHOTO_BYTES`), never text (``loadtest.perf_analyzer.inputs``)."""
    from tritonforge.tasks.image.samples import sample_photos

    sizes = {name: path.stat().st_size for name, path in sample_photos().items()}
    return [
        sample_photos()[name].read_bytes()
        for name in sorted(sizes, key=sizes.__getitem__)
        if sizes[name] <= PERF_MAX_PHOTO_BYTES
    ]


Classifier = Callable[[np.ndarray], np.ndarray]
"""``[batch, C, H, W]`` float32 pixels -> ``[batch, classes]`` logits."""


def opencv_pixels(data: bytes, spec: ImagePreprocessing) -> np.ndarray:
    """The same declared steps, but decoded and resized by OpenCV (``INTER_LINEAR``)."""
    import cv2

    bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if bgr is None:
        raise ValueError("OpenCV cannot decode the image")
    rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    size = resized_size(rgb.shape[1], rgb.shape[0], spec)
    resized = cv2.resize(rgb, size, interpolation=cv2.INTER_LINEAR)
    return normalise(crop(Image.fromarray(resized, "RGB"), spec), spec)


def encoded_views(photos: Mapping[str, Path]) -> list[tuple[str, bytes]]:
    """Each photo and its views (:func:`views`) as lossless PNG bytes."""
    out = []
    for name, path in photos.items():
        with Image.open(path) as opened:
            image = opened.convert("RGB")
        for i, view in enumerate(views(image)):
            buf = io.BytesIO()
            view.save(buf, "PNG", icc_profile=None)  # OpenCV warns on some profiles
            out.append((f"{name}#{i}", buf.getvalue()))
    return out


def skew_report(
    classify: Classifier,
    items: Sequence[tuple[str, bytes]],
    spec: ImagePreprocessing = EFFICIENTNET_LITE,
    batch: int = 8,
) -> dict[str, Any]:
    """Served (Pillow, as trained) vs OpenCV-resized inputs through ``classify``."""
    served = np.stack([preprocess(data, spec) for _, data in items])
    mismatched = np.stack([opencv_pixels(data, spec) for _, data in items])

    def probs(x: np.ndarray) -> np.ndarray:
        return np.concatenate(
            [softmax(classify(x[i : i + batch])) for i in range(0, len(x), batch)]
        )

    p_served, p_cv = probs(served), probs(mismatched)
    top1 = p_served.argmax(1) == p_cv.argmax(1)
    top5_s = np.argsort(-p_served, 1)[:, :5]
    top5_c = np.argsort(-p_cv, 1)[:, :5]
    overlap = [len(set(a) & set(b)) / 5 for a, b in zip(top5_s, top5_c, strict=True)]
    std = np.asarray(spec.std, dtype=np.float32)[:, None, None]
    pixel = np.abs(served - mismatched) * std * 255  # in 8-bit levels
    return {
        "images": len(items),
        "top1_agreement": float(top1.mean()),
        "top1_changed": [items[i][0] for i in np.flatnonzero(~top1)],
        "top5_overlap": float(np.mean(overlap)),
        "max_prob_diff": float(np.abs(p_served - p_cv).max()),
        "mean_top1_prob_drop": float(
            np.mean(p_served.max(1) - p_cv[np.arange(len(items)), p_served.argmax(1)])
        ),
        "pixel_levels_mean": float(pixel.mean()),
        "pixel_levels_max": float(pixel.max()),
    }


def torch_classifier(module: Any) -> Classifier:
    import torch

    def run(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return np.asarray(module(torch.from_numpy(x)).numpy())

    return run


def main(argv: Sequence[str] | None = None) -> int:
    from tritonforge.tasks.image.export.graph import efficientnet_lite0
    from tritonforge.tasks.image.samples import sample_photos

    del argv
    report = skew_report(torch_classifier(efficientnet_lite0()), encoded_views(sample_photos()))
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0
