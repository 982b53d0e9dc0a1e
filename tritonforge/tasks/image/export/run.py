"""``tritonforge export efficientnet_lite0`` (and ``--from-pretrained DIR --task image``): export
the CNN (ONNX + TorchScript, verified: eval mode, dynamic batch and spatial axes, grid vs PyTorch,
sidecars, atomic), then write every config of the pipeline, its stages' sources and labels.

The model export is skipped when its report records the same fingerprint (the spec, the task's
and the exporter's code, the weights' files, the libraries; ``force`` exports again); configs
and stage files are rewritten only where their content changed.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx

from tritonforge.errors import ArtifactIntegrityError
from tritonforge.export.errors import ExportError, SpecError, VerificationError
from tritonforge.export.pipeline_configs import stage_files, write_files
from tritonforge.export.spec import digest_json
from tritonforge.export.staging import code_digest, library_versions, task_export_files
from tritonforge.integrity import sha256_file, verify_sidecar
from tritonforge.tasks.image.export.configs import (
    BLS,
    LABELS_FILE,
    POSTPROCESS,
    image_configs,
    render,
)
from tritonforge.tasks.image.export.graph import (
    MODEL_FILE,
    REPORT_FILE,
    TORCHSCRIPT_FILE,
    export_image_model,
    image_export_spec,
)
from tritonforge.tasks.image.preprocessing import ImagePreprocessing
from tritonforge.tasks.image.spec import TASK as NAME
from tritonforge.tasks.image.spec import ImageSpec

log = logging.getLogger(__name__)


def load_ref(ref: str) -> Callable[[], Any]:
    """``package.module:function`` or ``path/to/file.py:function`` -> that function."""
    module_name, _, attr = ref.rpartition(":")
    if not module_name or not attr:
        raise SpecError(f"{ref!r}: write it as package.module:function or file.py:function")
    try:
        if module_name.endswith(".py"):
            found = importlib.util.spec_from_file_location(Path(module_name).stem, module_name)
            if found is None or found.loader is None:
                raise ImportError(f"{module_name} is not a Python file")
            module = importlib.util.module_from_spec(found)
            sys.modules[found.name] = module
            found.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
        factory = getattr(module, attr)
    except (ImportError, AttributeError, OSError, SyntaxError) as e:
        raise SpecError(f"{ref!r} cannot be loaded: {e}") from e
    if not callable(factory):
        raise SpecError(f"{ref!r} is not callable")
    return factory


def labels_of(spec: ImageSpec) -> tuple[str, ...]:
    """The spec's class names (``class_<i>`` when it names none); one per class."""
    if spec.labels.endswith(".txt"):
        lines = Path(spec.labels).read_text("utf-8").splitlines()
        labels: tuple[str, ...] = tuple(x.strip() for x in lines if x.strip())
    else:
        labels = tuple(load_ref(spec.labels)()) if spec.labels else ()
    labels = labels or tuple(f"class_{i}" for i in range(spec.classes))
    if len(labels) != spec.classes:
        raise SpecError(f"{spec.name}: {len(labels)} labels for {spec.classes} classes")
    return labels


def _sources_digest(spec: ImageSpec) -> dict[str, Any]:
    """The task's code, the exporter's, and the model's: its packages' versions (pinned model
    packages) or, for a ``file.py:function`` model, that file's (and a labels file's) digest."""
    h = hashlib.sha256()
    for rel, path in task_export_files(NAME):  # its export code, never its client or load tests
        h.update(rel.encode())
        h.update(path.read_bytes())
    out: dict[str, Any] = {"task_code": h.hexdigest(), "export_code": code_digest()}
    out["model_packages"] = {p: _version(p) for p in spec.packages}
    files = [
        Path(r.rpartition(":")[0]) for r in (spec.build,) if r.rpartition(":")[0].endswith(".py")
    ]
    files += [Path(spec.labels)] if spec.labels.endswith(".txt") else []
    out["model_files"] = {str(f): sha256_file(f) for f in files if f.is_file()}
    return out


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def fingerprint(spec: ImageSpec) -> dict[str, Any]:
    """Everything the model export depends on; equal digests mean an identical export."""
    parts = {
        "spec": spec.fingerprint_data(),
        **_sources_digest(spec),
        "libraries": library_versions(),
    }
    return {"digest": digest_json(parts), **parts}


def _up_to_date(spec: ImageSpec, repo: Path, digest: str) -> tuple[bool, str]:
    files = [f"{spec.model}/1/{MODEL_FILE}"]
    if spec.torchscript:
        files.append(f"{spec.torchscript_model}/1/{TORCHSCRIPT_FILE}")
    for rel in files:
        try:
            verify_sidecar(repo / rel, required=True)
        except (ArtifactIntegrityError, OSError) as e:
            return False, str(e)
    report = repo / spec.model / "1" / REPORT_FILE
    try:
        recorded = json.loads(report.read_text("utf-8"))["fingerprint"]["digest"]
    except (OSError, KeyError, ValueError):
        return False, f"{report} is missing or unreadable"
    return (recorded == digest, "inputs unchanged" if recorded == digest else "inputs changed")


def graph_dims(path: Path) -> tuple[int, ...]:
    """The ONNX graph's input dims without the batch axis (-1 where symbolic)."""
    shape = onnx.load(str(path), load_external_data=False).graph.input[0].type.tensor_type.shape
    return tuple(d.dim_value if d.HasField("dim_value") else -1 for d in shape.dim[1:])


def export_image(spec: ImageSpec, repo: Path, force: bool = False) -> list[str]:
    """Serve ``spec`` in ``repo``: the verified model (unless unchanged), then every config,
    stage source and labels file; the repository paths written."""
    labels = labels_of(spec)
    stamp = fingerprint(spec)
    ok, reason = _up_to_date(spec, repo, stamp["digest"])
    written: list[str] = []
    if force or not ok:
        log.info("==> [export %s] exporting the CNN (%s): eval, axes, grid", spec.name, reason)
        export_spec = image_export_spec(
            spec.model,
            load_ref(spec.build),
            spec.classes,
            spec.preprocessing,
            dynamic_spatial=spec.dynamic_spatial,
            max_batch=spec.max_batch,
        )
        export_image_model(
            export_spec,
            repo,
            spec.model,
            torchscript_model=spec.torchscript_model if spec.torchscript else None,
            fingerprint=stamp,
        )
        written.append(f"{spec.model}/1/{MODEL_FILE}")
    else:
        log.info("==> [export %s] model up to date (%s); configs only", spec.name, reason)
    dims = graph_dims(repo / spec.model / "1" / MODEL_FILE)
    files: dict[str, bytes] = {}
    text = ("\n".join(labels) + "\n").encode()
    for config, kind in image_configs(spec, dims):
        files[f"{config.name}/config.pbtxt"] = render(config, spec)
        if kind is not None:
            files.update(stage_files(config.name, kind))
        if kind in (POSTPROCESS, BLS) or config.platform == "ensemble":
            files[f"{config.name}/{LABELS_FILE}"] = text
        if config.platform == "ensemble":
            (repo / config.name / "1").mkdir(parents=True, exist_ok=True)
    written += write_files(repo, files)
    log.info("==> [export %s] done: %d file(s) written", spec.name, len(written))
    return written


def export_registered(spec: ImageSpec, repo: Path, force: bool = False) -> list[str]:
    """The registered spec's export."""
    return export_image(spec, repo, force)


MODEL_PY, PREPROCESSING_JSON = "model.py", "preprocessing.json"


def directory_spec(directory: Path, name: str) -> ImageSpec:
    """The spec of a user's torchvision-style model in ``directory``: ``model.py`` defining
    ``build()`` (the model with its weights), optional ``preprocessing.json``
    (:class:`ImagePreprocessing` fields; default torchvision's ImageNet recipe) and ``labels.txt``
    (one name a line; default ``class_<i>``, the count read from the model's output)."""
    source = directory / MODEL_PY
    if not source.is_file():
        raise SpecError(f"{source} does not exist: it must define build() returning the model")
    fields_path = directory / PREPROCESSING_JSON
    try:
        fields = json.loads(fields_path.read_text("utf-8")) if fields_path.is_file() else {}
        declared = {f"image.{k}": json.dumps(v) for k, v in dict(fields).items()}
        preprocessing = ImagePreprocessing.from_parameters(declared)
    except (ValueError, TypeError) as e:
        raise SpecError(f"{fields_path}: {e}") from e
    build = f"{source.resolve()}:build"
    labels = directory / LABELS_FILE
    return ImageSpec(
        name=name,
        description=f"image classifier from {directory}",
        build=build,
        classes=_count_classes(build, preprocessing),
        preprocessing=preprocessing,
        labels=str(labels.resolve()) if labels.is_file() else "",
    )


def _count_classes(build: str, preprocessing: ImagePreprocessing) -> int:
    import torch

    size = preprocessing.output_size or (224, 224)
    try:
        module = load_ref(build)().eval()
        with torch.inference_mode():
            out = module(torch.zeros((1, preprocessing.channels, *size)))
    except SpecError:
        raise
    except Exception as e:
        raise ExportError(f"{build}: the model did not run on [1, C, H, W]: {e}") from e
    if out.ndim != 2:
        raise VerificationError([f"output shape {list(out.shape)}: [batch, classes] expected"])
    return int(out.shape[1])


def export_directory(
    directory: Path,
    repo: Path,
    name: str,
    pretrained: bool,
    force: bool = False,
    max_length: int | None = None,
) -> list[str]:
    """``--from-pretrained DIR --task image`` (:func:`directory_spec`) served as ``name``;
    ``--from-onnx`` is not an image path; ``max_length``: unused (a text task's)."""
    if not pretrained:
        raise SpecError("--task image takes --from-pretrained DIR (model.py with build())")
    return export_image(directory_spec(directory, name), repo, force)
