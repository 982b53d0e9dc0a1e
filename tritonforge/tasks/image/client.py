"""The image task's client side: ``classify_image_flow`` (the client's
``.classify_image(images, top_k=None)``), ``tritonforge client classify-image FILE...`` and
``show`` (``make run``'s demo).

The served classifier is discovered from the server's configs (the ensemble or the BLS marked
with the task; its input, outputs and ``max_items`` from the config). Images are sent as they
are (encoded bytes, one BYTES row each); the server decodes and preprocesses them. A request is
answered whole: a bad image makes it an :class:`InvalidRequestError` naming ``image[i]``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tritonforge.client.errors import InvalidRequestError, ModelNotFoundError
from tritonforge.client.wire import make_outputs
from tritonforge.pipelines import ROLE_KEY, TASK_KEY, config_params
from tritonforge.tasks.classification.client import Ranked
from tritonforge.tasks.image.spec import TASK

if TYPE_CHECKING:
    from tritonforge.client.core import BaseClient, Flow

Emit = Callable[[str], None]
ImageInput = str | Path | bytes
# Images per request stop at this many encoded bytes (one larger image goes alone): the front
# refuses bodies over its max_body_bytes (2 MiB by default, docs/reliability.md) with a 413.
MAX_REQUEST_BYTES = 1536 * 1024


@dataclass(frozen=True)
class ImageClassifier:
    """One served image route: its model, input, outputs, bounds and ``top_k`` parameter."""

    model: str
    route: str  # ensemble | bls
    input: str
    outputs: tuple[str, ...]  # label, score, probabilities, top_labels, top_scores
    max_items: int
    classes: int


@dataclass(frozen=True)
class ImageClassification:
    """One image's answer: the best ``label`` and its ``score``, the ``top`` k (most probable
    first) and every class probability (index order)."""

    label: str
    score: float
    top: tuple[Ranked, ...]
    probabilities: np.ndarray

    def as_dict(self, probabilities: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "label": self.label,
            "score": round(self.score, 6),
            "top": [{"label": r.label, "score": round(r.score, 6)} for r in self.top],
        }
        if probabilities:
            out["probabilities"] = self.probabilities.tolist()
        return out


def served(configs: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], ImageClassifier]:
    """``(model, route)`` -> :class:`ImageClassifier` of each image ensemble and BLS served."""
    out: dict[tuple[str, str], ImageClassifier] = {}
    for config in configs:
        p = config_params(config)
        route = p.get(ROLE_KEY, "")
        if p.get(TASK_KEY) != TASK or route not in ("ensemble", "bls"):
            continue
        outputs = config.get("output", [])
        name = str(config["name"])
        probabilities = next(o for o in outputs if o.get("label_filename"))
        out[(name, route)] = ImageClassifier(
            name,
            route,
            str(config["input"][0]["name"]),
            tuple(str(o["name"]) for o in outputs),
            int(config.get("max_batch_size") or 1),
            int(probabilities["dims"][-1]),
        )
    return out


def pick(
    found: Mapping[tuple[str, str], ImageClassifier], name: str | None, route: str
) -> ImageClassifier:
    """The image classifier ``name`` (default: the only one) on ``route``."""
    matches = [r for (m, rt), r in found.items() if rt == route and (name in (None, m))]
    if len(matches) != 1:
        served_names = sorted(f"{m} ({rt})" for m, rt in found)
        raise ModelNotFoundError(
            f"no single image classifier {name or ''!r} on route {route!r}; served: {served_names}"
        )
    return matches[0]


def image_bytes(images: ImageInput | Sequence[ImageInput]) -> list[bytes]:
    """Paths (read here) or encoded bytes -> one bytes item per image; an unreadable path is an
    :class:`InvalidRequestError` naming ``image[i]``."""
    items = [images] if isinstance(images, str | Path | bytes) else list(images)
    out = []
    for i, item in enumerate(items):
        if isinstance(item, bytes):
            out.append(item)
            continue
        try:
            out.append(Path(item).read_bytes())
        except OSError as e:
            raise InvalidRequestError(f"image[{i}]: cannot read {item}: {e}") from e
    return out


def request_batches(
    items: Sequence[bytes], max_items: int, max_bytes: int = MAX_REQUEST_BYTES
) -> list[list[bytes]]:
    """``items`` cut, in order, into requests of at most ``max_items`` images and
    ``max_bytes`` encoded bytes (an image larger than that is a request of its own)."""
    out: list[list[bytes]] = []
    size = 0
    for item in items:
        if not out or len(out[-1]) >= max_items or size + len(item) > max_bytes:
            out.append([])
            size = 0
        out[-1].append(item)
        size += len(item)
    return out


def classify_image_flow(
    client: BaseClient,
    images: ImageInput | Sequence[ImageInput],
    top_k: int | None = None,
    name: str | None = None,
    route: str = "ensemble",
    traceparent: str | None = None,
) -> Flow[list[ImageClassification]]:
    """Classify each image (a path or encoded bytes; one or a list), in requests of at most the
    served ``max_items`` images and :data:`MAX_REQUEST_BYTES`; one answer per image, in order."""
    configs = yield from client.served_configs_flow()
    target = pick(served(configs), name, route)
    items = image_bytes(images)
    if not items:
        raise InvalidRequestError("images: give at least one image")
    if top_k is not None and not 1 <= top_k <= target.classes:
        raise InvalidRequestError(f"top_k: {top_k} is not in [1, {target.classes}]")
    module = client.tritonclient
    label, score, probabilities, top_labels, top_scores = target.outputs
    parameters = {} if top_k is None else {"top_k": top_k}
    answers: list[ImageClassification] = []
    for chunk in request_batches(items, target.max_items):
        data = np.array([[b] for b in chunk], dtype=np.object_)
        infer_input = module.InferInput(target.input, list(data.shape), "BYTES")
        infer_input.set_data_from_numpy(data)
        outputs = make_outputs(module, target.outputs)
        headers = client.trace(traceparent)
        call = client.infer_call(target.model, [infer_input], outputs, parameters, headers)
        result = yield call
        got = {n: result.as_numpy(n) for n in target.outputs}
        for i in range(len(chunk)):
            names = [_text(x) for x in np.asarray(got[top_labels][i]).reshape(-1)]
            scores = np.asarray(got[top_scores][i], dtype=np.float64).reshape(-1)
            answers.append(
                ImageClassification(
                    label=_text(np.asarray(got[label][i]).reshape(-1)[0]),
                    score=float(np.asarray(got[score][i]).reshape(-1)[0]),
                    top=tuple(Ranked(n, float(s)) for n, s in zip(names, scores, strict=True)),
                    probabilities=np.asarray(got[probabilities][i], dtype=np.float32),
                )
            )
    return answers


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def add_parser(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    """``tritonforge client classify-image FILE...``."""
    p = sub.add_parser("classify-image", help="classify image files (served image classifier)")
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--top-k", type=int, help="the K most probable labels (default: the server's)")
    p.add_argument("--model", help="the image classifier (default: the only one served)")
    common(p)
    p.set_defaults(func=cmd_classify_image)


def cmd_classify_image(args: argparse.Namespace) -> dict[str, Any]:
    with args.open_client(args) as c:
        route = "bls" if c.settings.route == "bls" else "ensemble"
        answers = c.classify_image(args.files, args.top_k, args.model, route)
    pairs = zip(args.files, answers, strict=True)
    return {"results": [{"file": str(f), **a.as_dict()} for f, a in pairs]}


def show(open_client: Callable[..., Any], pipeline: object, emit: Emit) -> None:
    """Classify the sample photos over HTTP (ensemble) and gRPC (BLS); ``pipeline``: unused
    (the pipeline tasks' ``show`` signature)."""
    from tritonforge.tasks.image.samples import sample_photos

    photos = dict(list(sample_photos().items())[:4])
    with open_client("http") as c:
        try:
            answers = c.classify_image(list(photos.values()), top_k=3)
        except ModelNotFoundError as e:
            emit(f"\n==> image: not served ({e}); `tritonforge export efficientnet_lite0`")
            return
    emit("\n==> classify-image (HTTP, ensemble), the top 3 of each sample photo:")
    for photo, a in zip(photos, answers, strict=True):
        tops = ", ".join(f"{r.label} {r.score:.3f}" for r in a.top)
        emit(f"  {photo:<18} {tops}")
    with open_client("grpc", "bls") as c:
        bls = c.classify_image(list(photos.values()), top_k=3, route="bls")
    same = [a.label for a in bls] == [a.label for a in answers]
    emit(f"==> the BLS over gRPC: same labels: {same}\n")


# the client methods this task adds (client.core.install_task_methods)
METHODS: dict[str, Callable[..., Any]] = {"classify_image": classify_image_flow}
