"""The image pipeline's configs, generated from its :class:`ImageSpec` and the exported graph:
the preprocess stage (its ``image.*`` parameters are the spec's :class:`ImagePreprocessing`), the
model (ONNX; TorchScript beside it), the postprocess (softmax, top-k, ``labels.txt``: Triton's
classification extension), the ensemble and the BLS. Tensor dims come from the graph."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterable

import numpy as np
from PIL import Image

from tritonforge.classify import OUTPUTS, TOP_K_PARAMETER
from tritonforge.configschema import (
    DynamicBatching,
    EnsembleStep,
    InstanceGroup,
    TritonConfig,
    params,
    render_pbtxt,
)
from tritonforge.modelconfig import TensorSpec
from tritonforge.pipelines import ROLE_KEY, TASK_KEY
from tritonforge.repository import CANARY_KEY
from tritonforge.tasks.image.spec import IMAGE_INPUT, LOGITS, PIXELS, TASK, ImageSpec

# the stage kinds the task declares (tritonforge.tasks.image.TASK.stages)
PREPROCESS, POSTPROCESS, BLS = "image_preprocess", "image_postprocess", "image_bls"
LABELS_FILE = "labels.txt"
STAGE_TIMEOUT_MS = 30000
TORCHSCRIPT_IO = ("INPUT__0", "OUTPUT__0")  # the PyTorch backend's positional names


def canary_image() -> str:
    """A small valid PNG, base64: the canaries' item for the public models (runtime.supervisor.canaries)."""
    ramp = np.linspace(0, 255, 32, dtype=np.uint8)
    pixels = np.stack(
        [np.tile(ramp, (32, 1)), np.tile(ramp[:, None], (1, 32)), 255 - np.tile(ramp, (32, 1))], -1
    )
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def _marks(role: str) -> dict[str, object]:
    return {TASK_KEY: TASK, ROLE_KEY: role}


def model_tensors(graph_dims: tuple[int, ...], classes: int) -> tuple[TensorSpec, TensorSpec]:
    """The model's input (``graph_dims``: the graph's dims without batch, -1 where symbolic)
    and its logits."""
    return (
        TensorSpec(PIXELS, "TYPE_FP32", graph_dims),
        TensorSpec(LOGITS, "TYPE_FP32", (classes,)),
    )


def _public_io(spec: ImageSpec) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    label, score, probabilities, top_labels, top_scores = OUTPUTS
    outputs = (
        TensorSpec(label, "TYPE_STRING", (1,)),
        TensorSpec(score, "TYPE_FP32", (1,)),
        TensorSpec(probabilities, "TYPE_FP32", (spec.classes,), label_filename=LABELS_FILE),
        TensorSpec(top_labels, "TYPE_STRING", (-1,)),
        TensorSpec(top_scores, "TYPE_FP32", (-1,)),
    )
    return (TensorSpec(IMAGE_INPUT, "TYPE_STRING", (1,)),), outputs


def _ort_model(spec: ImageSpec, pixels: TensorSpec, logits: TensorSpec) -> TritonConfig:
    return TritonConfig(
        name=spec.model,
        backend="onnxruntime",
        max_batch_size=spec.max_batch,
        default_model_filename="model.onnx",
        inputs=(pixels,),
        outputs=(logits,),
        instance_groups=(InstanceGroup(1),),
        dynamic_batching=DynamicBatching(),
        parameters=params(
            {
                "batch_rows": "together",
                "inter_op_thread_count": 1,
                "intra_op_thread_count": 1,
                "session.intra_op.allow_spinning": 0,
                **_marks("model"),
            }
        ),
    )


def _torchscript_model(spec: ImageSpec, pixels: TensorSpec, logits: TensorSpec) -> TritonConfig:
    into, out = TORCHSCRIPT_IO
    return TritonConfig(
        name=spec.torchscript_model,
        backend="pytorch",
        max_batch_size=spec.max_batch,
        default_model_filename="model.pt",
        inputs=(TensorSpec(into, pixels.data_type, pixels.dims),),
        outputs=(TensorSpec(out, logits.data_type, logits.dims),),
        instance_groups=(InstanceGroup(1),),
        parameters=params(
            {"INTRA_OP_THREAD_COUNT": 1, "INTER_OP_THREAD_COUNT": 1, **_marks("model")}
        ),
    )


def image_configs(
    spec: ImageSpec, graph_dims: tuple[int, ...]
) -> tuple[tuple[TritonConfig, str | None], ...]:
    """Every config of the pipeline with the stage kind whose source is its ``model.py``
    (None: the models and the ensemble)."""
    pixels, logits = model_tensors(graph_dims, spec.classes)
    public_in, public_out = _public_io(spec)
    served_pixels = TensorSpec(PIXELS, "TYPE_FP32", spec.preprocessing.output_shape())
    image_settings = {**spec.preprocessing.to_parameters(), "max_items": spec.max_items}
    top_k = min(spec.top_k, spec.classes)  # a 4-class model answers its top 4 by default
    canary = canary_image()
    preprocess = TritonConfig(
        name=spec.preprocess_model,
        backend="python",
        max_batch_size=spec.max_items,
        inputs=public_in,
        outputs=(served_pixels,),
        instance_groups=(InstanceGroup(1),),
        parameters=params({**image_settings, **_marks("preprocess")}),
    )
    post = TritonConfig(
        name=spec.postprocess_model,
        backend="python",
        max_batch_size=spec.max_items,
        inputs=(TensorSpec(LOGITS, logits.data_type, logits.dims),),
        outputs=public_out,
        instance_groups=(InstanceGroup(1),),
        parameters=params({TOP_K_PARAMETER: top_k, **_marks("postprocess")}),
    )
    steps = (
        EnsembleStep(spec.preprocess_model, _same([IMAGE_INPUT]), _same([PIXELS])),
        EnsembleStep(spec.model, _same([PIXELS]), _same([LOGITS])),
        EnsembleStep(spec.postprocess_model, _same([LOGITS]), _same(OUTPUTS)),
    )
    ensemble = TritonConfig(
        name=spec.ensemble,
        platform="ensemble",
        max_batch_size=spec.max_items,
        inputs=public_in,
        outputs=public_out,
        ensemble_steps=steps,
        parameters=params({TOP_K_PARAMETER: top_k, CANARY_KEY: canary, **_marks("ensemble")}),
    )
    bls = TritonConfig(
        name=spec.bls,
        backend="python",
        max_batch_size=spec.max_items,
        inputs=public_in,
        outputs=public_out,
        instance_groups=(InstanceGroup(1),),
        parameters=params(
            {
                **image_settings,
                "image_model": spec.model,
                "model_input": PIXELS,
                "model_output": LOGITS,
                "stage_timeout_ms": STAGE_TIMEOUT_MS,
                TOP_K_PARAMETER: top_k,
                CANARY_KEY: canary,
                **_marks("bls"),
            }
        ),
    )
    configs: list[tuple[TritonConfig, str | None]] = [
        (_ort_model(spec, pixels, logits), None),
        (preprocess, PREPROCESS),
        (post, POSTPROCESS),
        (ensemble, None),
        (bls, BLS),
    ]
    if spec.torchscript:
        # served alone (no stage in front): the preprocessed size, which its canary sends too
        configs.insert(1, (_torchscript_model(spec, served_pixels, logits), None))
    return tuple(configs)


def _same(names: Iterable[str]) -> tuple[tuple[str, str], ...]:
    return tuple((n, n) for n in names)


def render(config: TritonConfig, spec: ImageSpec) -> bytes:
    """config.pbtxt bytes with the header every generated config carries."""
    header = f"# Generated by `make export` from the image spec {spec.name!r}; edit the spec.\n"
    return (header + render_pbtxt(config)).encode()
