"""The image task's bench cell: images/s served by Triton (ensemble or BLS, through the typed
client) versus the same preprocessing and graph in-process (the limit: no wire, no server) and
versus the service users typically write (:mod:`.fastapi_anchor`: FastAPI + PyTorch eager).

Each figure is the median of ``runs`` interleaved passes over the same photos, one image per
request (batch 1, one client: latency-bound), and for Triton also the photos in as few requests
as the client sends them. Ratios measured in one run; the machine's load is the caller's to
report (a shared machine moves absolute figures, not much the ratios).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tritonforge.classify import softmax
from tritonforge.tasks.image.preprocessing import ImagePreprocessing
from tritonforge.tasks.image.transforms import preprocess


class OrtImageClassifier:
    """In-process reference: :func:`preprocess` then ONNX Runtime on ``model.onnx`` with the
    served model's one intra-op thread, then softmax."""

    def __init__(self, path: Path, spec: ImagePreprocessing, threads: int = 1) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.log_severity_level = 3
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0].name
        self.spec = spec

    def probabilities(self, images: Sequence[bytes]) -> np.ndarray:
        pixels = np.stack([preprocess(b, self.spec, i) for i, b in enumerate(images)])
        (logits,) = self.session.run(None, {self.input: pixels})
        return softmax(logits)


def _seconds(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def bench_cell(
    client: Any,
    reference: OrtImageClassifier,
    images: Sequence[bytes],
    route: str = "ensemble",
    fastapi: Callable[[bytes], Any] | None = None,
    runs: int = 3,
) -> dict[str, Any]:
    """Images/s of ``images``: served (``client.classify_image`` on ``route``, one image per
    request and all at once), in process (``reference``, one at a time) and through ``fastapi``
    (a callable posting one image), medians of ``runs`` interleaved passes."""
    passes: dict[str, list[float]] = {"served": [], "served_batched": [], "in_process": []}
    if fastapi is not None:
        passes["fastapi_pytorch"] = []
    for _ in range(runs):
        passes["served"].append(
            _seconds(lambda: [client.classify_image(b, route=route) for b in images])
        )
        passes["served_batched"].append(
            _seconds(lambda: client.classify_image(list(images), route=route))
        )
        passes["in_process"].append(
            _seconds(lambda: [reference.probabilities([b]) for b in images])
        )
        if fastapi is not None:
            passes["fastapi_pytorch"].append(_seconds(lambda: [fastapi(b) for b in images]))
    rates = {k: len(images) / statistics.median(v) for k, v in passes.items()}
    cell: dict[str, Any] = {"cell": f"image {route}", "images": len(images)}
    cell.update({f"{k}_images_per_s": round(v, 2) for k, v in rates.items()})
    cell["served_over_in_process"] = round(rates["served"] / rates["in_process"], 3)
    if fastapi is not None:
        cell["served_over_fastapi"] = round(rates["served"] / rates["fastapi_pytorch"], 3)
    return cell


def bench_section(client: Any, repository: Path, runs: int = 3) -> list[dict[str, Any]]:
    """``make bench``'s image section (``loadtest.bench.sections``): the default CNN's ensemble
    and BLS over the sample photos, served vs in-process; ``[]`` when it is not exported."""
    from tritonforge.tasks.image.samples import sample_photos
    from tritonforge.tasks.image.spec import EFFICIENTNET_LITE0

    spec = EFFICIENTNET_LITE0
    graph = repository / spec.model / "1" / "model.onnx"
    if not graph.is_file():
        return []
    reference = OrtImageClassifier(graph, spec.preprocessing)
    images = [path.read_bytes() for path in sample_photos().values()]
    return [bench_cell(client, reference, images, route=r, runs=runs) for r in ("ensemble", "bls")]
