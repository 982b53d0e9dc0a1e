"""The rerank pipeline's configs, generated from its :class:`RerankSpec` and the imported graph:
the pair tokenizer, the encoder (inputs/outputs derived from the graph), the postprocess, the
``rerank`` ensemble and the ``rerank_bls`` BLS (one query's N documents scored in one encoder
call). The spec's bounds are the stages' ``parameters``; the tensor names are the spec's."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tritonforge.configschema import EnsembleStep, InstanceGroup, TritonConfig, params, render_pbtxt
from tritonforge.export.onnx_import import MODEL_FILE, TOKENIZER_FILE, ImportedGraph
from tritonforge.modelconfig import TensorSpec
from tritonforge.pipelines import ROLE_KEY, TASK_KEY
from tritonforge.tasks.rerank.spec import TASK, RerankSpec

# the stage kinds the task declares (tritonforge.tasks.rerank.TASK.stages)
PAIR_TOKENIZER, POSTPROCESS, BLS = "rerank_pair_tokenizer", "rerank_postprocess", "rerank_bls"
MAX_BATCH = 64  # the encoder's rows per execute (Triton merges requests up to it)
STAGE_TIMEOUT_MS = 30000
PAIR_LOGITS = "pair_logits"  # the ensemble's name of the encoder's output


def _marks(role: str) -> dict[str, object]:
    return {TASK_KEY: TASK, ROLE_KEY: role}


def _encoder_tensors(graph: ImportedGraph) -> tuple[tuple[TensorSpec, ...], TensorSpec]:
    io = graph.triton_tensors()
    inputs = tuple(TensorSpec(t["name"], t["data_type"], tuple(t["dims"])) for t in io["input"])
    out = io["output"][0]
    return inputs, TensorSpec(out["name"], out["data_type"], tuple(out["dims"]))


def _pair_settings(spec: RerankSpec) -> dict[str, object]:
    settings: dict[str, object] = {
        "query_input": spec.query_input,
        "documents_input": spec.documents_input,
        "max_documents": spec.limits.max_documents,
        "max_document_bytes": spec.limits.max_document_bytes,
        "max_query_bytes": spec.limits.max_query_bytes,
        "max_length": spec.max_length,
        "tokenizer_file": TOKENIZER_FILE,
    }
    if spec.truncation:
        settings["truncation"] = spec.truncation
    return settings


def _public_io(spec: RerankSpec) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    scores, logits, ranking = spec.outputs
    inputs = (
        TensorSpec(spec.query_input, "TYPE_STRING", (1,)),
        TensorSpec(spec.documents_input, "TYPE_STRING", (-1,)),
    )
    outputs = (
        TensorSpec(scores, "TYPE_FP32", (-1,)),
        TensorSpec(logits, "TYPE_FP32", (-1,)),
        TensorSpec(ranking, "TYPE_INT64", (-1,)),
    )
    return inputs, outputs


def _encoder_config(
    spec: RerankSpec, tokens: Sequence[TensorSpec], logits: TensorSpec, pad_id: int
) -> TritonConfig:
    """The cross-encoder's config: the tokens in, the pair logits out."""
    names = [t.name for t in tokens]
    pads = ",".join(f"{n}={pad_id if n == 'input_ids' else 0}" for n in names)
    return TritonConfig(
        name=spec.encoder_model,
        backend="onnxruntime",
        max_batch_size=MAX_BATCH,
        default_model_filename=MODEL_FILE,
        inputs=tuple(tokens),
        outputs=(logits,),
        instance_groups=(InstanceGroup(1),),
        parameters=params(
            {
                "batch_rows": spec.batch_rows,
                "inter_op_thread_count": 1,
                "intra_op_thread_count": 1,
                "pad_values": pads,
                "session.intra_op.allow_spinning": 0,
                **_marks("encoder"),
            }
        ),
    )


def _bls_config(
    spec: RerankSpec,
    names: Sequence[str],
    logits: str,
    public_in: tuple[TensorSpec, ...],
    public_out: tuple[TensorSpec, ...],
) -> TritonConfig:
    """The BLS's config: tokenizes itself, one encoder call per batch of pairs."""
    return TritonConfig(
        name=spec.bls,
        backend="python",
        max_batch_size=0,
        inputs=public_in,
        outputs=public_out,
        instance_groups=(InstanceGroup(1),),
        parameters=params(
            {
                **_pair_settings(spec),
                "score_model": spec.encoder_model,  # (the lint reads encoder_model as a tokenizer's)
                "encoder_inputs": ",".join(names),
                "encoder_output": logits,
                "stage_timeout_ms": STAGE_TIMEOUT_MS,
                "top_n_parameter": spec.top_n_parameter,
                **_marks("bls"),
            }
        ),
    )


def rerank_configs(
    spec: RerankSpec, graph: ImportedGraph, pad_id: int
) -> tuple[tuple[TritonConfig, str | None], ...]:
    """Every config of the pipeline with the stage kind whose source is its ``model.py``
    (None: the encoder and the ensemble)."""
    tokens, logits = _encoder_tensors(graph)
    names = [t.name for t in tokens]
    public_in, public_out = _public_io(spec)
    encoder = _encoder_config(spec, tokens, logits, pad_id)
    tokenizer = TritonConfig(
        name=spec.tokenizer_model,
        backend="python",
        max_batch_size=0,
        inputs=public_in,
        outputs=tuple(TensorSpec(t.name, t.data_type, (-1, -1)) for t in tokens),
        parameters=params({**_pair_settings(spec), **_marks("tokenizer")}),
    )
    post = TritonConfig(
        name=spec.postprocess_model,
        backend="python",
        max_batch_size=0,
        inputs=(TensorSpec(PAIR_LOGITS, logits.data_type, (-1, *logits.dims)),),
        outputs=public_out,
        parameters=params({"top_n_parameter": spec.top_n_parameter, **_marks("postprocess")}),
    )
    steps = (
        EnsembleStep(
            spec.tokenizer_model, tuple((t.name, t.name) for t in public_in), _same(names)
        ),
        EnsembleStep(spec.encoder_model, _same(names), ((logits.name, PAIR_LOGITS),)),
        EnsembleStep(spec.postprocess_model, _same([PAIR_LOGITS]), _same(spec.outputs)),
    )
    ensemble = TritonConfig(
        name=spec.ensemble,
        platform="ensemble",
        max_batch_size=0,
        inputs=public_in,
        outputs=public_out,
        ensemble_steps=steps,
        parameters=params({"top_n_parameter": spec.top_n_parameter, **_marks("ensemble")}),
    )
    bls = _bls_config(spec, names, logits.name, public_in, public_out)
    return (
        (encoder, None),
        (tokenizer, PAIR_TOKENIZER),
        (post, POSTPROCESS),
        (ensemble, None),
        (bls, BLS),
    )


def _same(names: Iterable[str]) -> tuple[tuple[str, str], ...]:
    return tuple((n, n) for n in names)


def render(config: TritonConfig, spec: RerankSpec) -> bytes:
    """config.pbtxt bytes with the header every generated config carries."""
    header = f"# Generated by `make export` from the rerank spec {spec.name!r}; edit the spec.\n"
    return (header + render_pbtxt(config)).encode()
