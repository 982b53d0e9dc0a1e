"""Does int8 pay for an image model here? Static QDQ, per channel, calibrated on photos, gated on
top-1 agreement with fp32 over held-out photos, and timed against fp32 in-process.

A variant is only worth serving when it is both faster here and passes the gate; this module
measures both (:func:`measure_int8`) and leaves the decision to the numbers it returns
(docs/images.md records them). It reuses ``export/quantize.py`` (``quantize_int8``,
``gate_figures``) and ``export/parity.py`` (ONNX Runtime runner, interleaved timing).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from tritonforge.export.parity import median_latency_ms, ort_runner
from tritonforge.export.quantize import gate_figures, passes, quantize_int8
from tritonforge.export.spec import CPU_TARGET, Inputs, QualityGate, Quantization
from tritonforge.tasks.image.export.graph import INPUT, OUTPUT
from tritonforge.tasks.image.preprocessing import ImagePreprocessing
from tritonforge.tasks.image.transforms import crop, normalise, resize

STATIC_QDQ = Quantization(
    methods=((CPU_TARGET, "static_qdq"),),
    op_types=("Conv", "MatMul", "Gemm"),
    weights_only=False,
    per_channel=True,
    symmetric=True,
)
TOP1_GATE = QualityGate(output=OUTPUT, metric="top1", top1_agreement_min=0.95)


def views(image: Image.Image) -> list[Image.Image]:
    """The photo, mirrored, and its centre at 80% and 60% (more distinct rows per photo)."""
    out = [image, ImageOps.mirror(image)]
    for share in (0.8, 0.6):
        w, h = image.size
        cw, ch = int(w * share), int(h * share)
        left, top = (w - cw) // 2, (h - ch) // 2
        out.append(image.crop((left, top, left + cw, top + ch)))
    return out


def photo_batches(
    paths: Sequence[Path], preprocessing: ImagePreprocessing, rows: int = 4
) -> list[Inputs]:
    """Every view of every photo, preprocessed as served, in batches of ``rows``."""
    tensors = []
    for path in paths:
        with Image.open(path) as opened:
            image = opened.convert(preprocessing.color_mode)
        tensors += [
            normalise(crop(resize(v, preprocessing), preprocessing), preprocessing)
            for v in views(image)
        ]
    stacked = np.stack(tensors)
    return [{INPUT: stacked[i : i + rows]} for i in range(0, len(stacked), rows)]


def measure_int8(
    fp32: Path,
    photos: Mapping[str, Path],
    preprocessing: ImagePreprocessing,
    workdir: Path,
    threads: int = 1,
) -> dict[str, Any]:
    """Quantize ``fp32`` (calibrated on half the photos), gate it on the other half, time both.

    Returns the gate figures (``top1_agreement``, ``max_prob_diff``), whether it ``passes``, the
    median latency of each at batch 1 and 8 (runs interleaved) and the ``speedup`` at both.
    """
    names = sorted(photos)
    calibration = photo_batches([photos[n] for n in names[::2]], preprocessing)
    held_out = photo_batches([photos[n] for n in names[1::2]], preprocessing)
    int8 = workdir / "model.int8.onnx"
    quantize_int8(fp32, int8, STATIC_QDQ, calibration, workdir / "calibration.cache")
    runners = {"fp32": ort_runner(fp32, threads), "int8": ort_runner(int8, threads)}
    reference = [runners["fp32"](b)[OUTPUT] for b in held_out]
    figures = gate_figures(runners["int8"], held_out, reference, TOP1_GATE)
    rows = np.concatenate([b[INPUT] for b in held_out])
    latency = {
        f"batch{n}": median_latency_ms(runners, {INPUT: rows[:n]}, repeats=8)
        for n in (1, min(8, len(rows)))
    }
    return {
        "calibration_rows": sum(len(b[INPUT]) for b in calibration),
        "held_out_rows": len(rows),
        "gate": TOP1_GATE.thresholds(),
        **figures,
        "passes": passes(figures, TOP1_GATE),
        "latency_ms": latency,
        "speedup": {k: v["fp32"] / v["int8"] for k, v in latency.items()},
        "threads": threads,
    }
