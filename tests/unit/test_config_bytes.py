"""Every config.pbtxt (and configs/gpu.pbtxt) of an exported repository, rendered again from the
default specs by today's code, is byte-identical to the file the export wrote.

This proves a refactor of the config writers changed no byte: the encoders' configs are rebuilt
from their exported graphs (ONNX, or the spec for TorchScript) exactly as ``export.encoder``
does; the pipeline stages' from :func:`generate_files`; ``generate``'s from the decoder spec.
Needs an exported repository (``$TRITONFORGE_MODEL_REPOSITORY``, default ``model_repository``):
skipped with the reason otherwise. No export runs and no classifier is trained here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tritonforge.export.pipeline_configs import generate_files
from tritonforge.export.pipeline_spec import PipelineSpec
from tritonforge.export.spec import CPU_TARGET, GPU_TARGET, ExportSpec
from tritonforge.export.specs import decoder_names, get_decoder, get_pipeline, pipeline_names
from tritonforge.export.tritonconfig import (
    GPU_CONFIG,
    build_config,
    latest_version_dir,
    onnx_io,
    render_pbtxt,
    torchscript_io,
)
from tritonforge.tasks.generation.export.config import int8_served, models, render_config

REPOSITORY = Path(os.environ.get("TRITONFORGE_MODEL_REPOSITORY") or "model_repository")


def _repository() -> Path:
    if not any(REPOSITORY.glob("*/config.pbtxt")):
        why = f"no exported repository at {REPOSITORY} (run `make export` or set TRITONFORGE_MODEL_REPOSITORY)"
        pytest.skip(reason=why)
    return REPOSITORY


def _pipeline(name: str) -> PipelineSpec:
    if name == "sentiment":
        from tritonforge.export.specs.sentiment import classifier_dir

        if not all((classifier_dir() / f"v{n}" / "config.json").is_file() for n in (1, 2)):
            why = (
                f"the default classifier is not built in {classifier_dir()}; run `make classifier`"
            )
            pytest.skip(reason=why)
    return get_pipeline(name)


def _encoder_texts(spec: PipelineSpec, repo: Path) -> Iterator[tuple[str, str]]:
    """(repo-relative path, text rendered now) of each exported encoder config, as
    ``export.encoder`` renders them (the latest version's spec and graph)."""
    for variant in spec.variants:
        model = spec.names.encoder(variant)
        version = latest_version_dir(repo / model) if (repo / model).is_dir() else None
        if version is None:
            continue
        encoder: ExportSpec = next(
            v.encoder for v in spec.versions if v.number == int(version.name)
        )
        serving = encoder.serving
        assert serving is not None
        warmup = encoder.warmup() if encoder.warmup else None
        torchscript = variant == "torchscript"
        artifact = version / ("model.pt" if torchscript else "model.onnx")
        quantized = model == serving.int8_name
        gpu_int8 = version / encoder.quantization.artifact_name(GPU_TARGET)
        for rel, gpu in (("config.pbtxt", False), (str(GPU_CONFIG), True)):
            path, target = artifact, CPU_TARGET
            if gpu and quantized and gpu_int8 != artifact and gpu_int8.is_file():
                path, target = gpu_int8, GPU_TARGET
            io = torchscript_io(encoder) if torchscript else onnx_io(path)
            config = build_config(
                model,
                "pytorch" if torchscript else "onnxruntime",
                path.name,
                io,
                encoder,
                warmup,
                gpu=gpu,
                quantized=quantized,
                int8_method=encoder.quantization.method(target),
            )
            yield f"{model}/{rel}", render_pbtxt(config)


def _compare(repo: Path, rendered: dict[str, bytes]) -> list[str]:
    assert rendered, "nothing was rendered"
    return [
        rel for rel, content in sorted(rendered.items()) if (repo / rel).read_bytes() != content
    ]


@pytest.mark.parametrize("name", pipeline_names())
def test_pipeline_configs_are_byte_identical(name: str) -> None:
    repo = _repository()
    spec = _pipeline(name)
    if not (repo / spec.names.encoder("fp32") / "config.pbtxt").is_file():
        pytest.skip(reason=f"pipeline {name!r} is not exported into {repo}")
    rendered = {rel: text.encode() for rel, text in _encoder_texts(spec, repo)}
    assert len(rendered) >= 2
    rendered.update(
        {rel: c for rel, c in generate_files(spec, repo).items() if rel.endswith("config.pbtxt")}
    )
    assert _compare(repo, rendered) == []


@pytest.mark.parametrize("name", decoder_names())
def test_generate_configs_are_byte_identical(name: str) -> None:
    repo = _repository()
    spec = get_decoder(name)
    # the names follow from whether int8 passed its gate (the export's report records it)
    int8 = int8_served(spec, repo, int8=True) and all(
        (repo / m / "config.pbtxt").is_file() for m in models(spec, int8=True).values()
    )
    exported = models(spec, int8)
    if not all((repo / m / "config.pbtxt").is_file() for m in exported.values()):
        pytest.skip(reason=f"decoder {name!r} is not exported into {repo}")
    rendered = {
        f"{model}/config.pbtxt": render_config(spec, variant, int8).encode()
        for variant, model in exported.items()
    }
    assert _compare(repo, rendered) == []
