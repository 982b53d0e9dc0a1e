"""Export stage on tiny generated modules: dynamic-axis leaks, Q/DQ audit, atomic writes."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from tritonforge.export.encoder import Options, run_export
from tritonforge.export.errors import QuantAuditError, VerificationError
from tritonforge.export.int8_audit import audit_dynamic, audit_int8, audit_qdq
from tritonforge.export.quantize import quantize_int8
from tritonforge.export.spec import (
    BATCH_AXIS,
    ExportSpec,
    Inputs,
    Quantization,
    Serving,
    TensorDecl,
)
from tritonforge.export.staging import clean, staging_parent
from tritonforge.export.tritonconfig import check_repository, cross_check, onnx_io
from tritonforge.integrity import verify_sidecar
from tritonforge.modelconfig import pbtxt_to_dict


class Pooled(torch.nn.Module):
    """[batch, seq, 4] -> mean over seq -> Linear -> [batch, 3]."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x.mean(dim=1))


class BakedBatch(Pooled):
    """Bakes the traced batch size into a reshape (``int()`` makes the tracer record a constant):
    fine in eager mode at any batch size, silently fixed to 2 in the exported graph."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch = int(x.shape[0])
        return self.proj(x.reshape(batch, -1, 4).mean(dim=1))


class TraceSpecialised(Pooled):
    """Exports cleanly, but the traced branch is wrong for short sequences (parity fails)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = x.mean(dim=1) if x.shape[1] > 3 else x.sum(dim=1)
        return self.proj(pooled)


def _examples(lengths: Sequence[int], rng: np.random.Generator) -> Inputs:
    return {"x": rng.standard_normal((len(lengths), max(lengths), 4)).astype(np.float32)}


def tiny_spec(module: type[torch.nn.Module], name: str = "tiny") -> ExportSpec:
    return ExportSpec(
        name=name,
        description="tiny test module",
        build_module=module,
        inputs=(TensorDecl("x", "float32", (BATCH_AXIS, "sequence_length", 4)),),
        outputs=(TensorDecl("y", "float32", (BATCH_AXIS, 3), atol=1e-5, rtol=1e-4),),
        example_inputs=_examples,
        max_batch=8,
        max_length=16,
        trace_lengths=(6, 6),
        grid=((1, 1), (2, 5), (7, 16), (8, 2)),
        benchmark_lengths=(4, 4),
        serving=Serving(fp32_name="tiny_fp32", torchscript_name="tiny_torchscript"),
    )


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def populated_repo(tmp_path: Path) -> Path:
    """A repository holding an earlier export of the tiny model plus an unrelated model."""
    repo = tmp_path / "repo"
    run_export(tiny_spec(Pooled), Options(repo=repo), progress=lambda _: None)
    (repo / "other" / "1").mkdir(parents=True)
    (repo / "other" / "config.pbtxt").write_text('name: "other"\nbackend: "python"\n')
    return repo


def test_tiny_export_writes_verified_artifacts_and_skips_rerun(populated_repo: Path) -> None:
    repo = populated_repo
    onnx_path = repo / "tiny_fp32" / "1" / "model.onnx"
    assert verify_sidecar(onnx_path, required=True)
    assert verify_sidecar(repo / "tiny_torchscript" / "1" / "model.pt", required=True)
    assert (repo / "tiny_fp32" / "1" / "export_report.md").exists()
    assert not list(staging_parent(repo).glob("*")), "staging directory left behind"
    config = pbtxt_to_dict((repo / "tiny_fp32" / "config.pbtxt").read_text())
    assert [t["dims"] for t in config["input"]] == [[-1, 4]]
    assert check_repository(repo, [tiny_spec(Pooled)]) == []
    before = snapshot(repo)
    outcome = run_export(tiny_spec(Pooled), Options(repo=repo), progress=lambda _: None)
    assert outcome.skipped and snapshot(repo) == before


def test_clean_removes_only_generated_models(populated_repo: Path) -> None:
    serving = tiny_spec(Pooled).serving
    assert serving is not None
    removed = clean(populated_repo, [serving.fp32_name, str(serving.torchscript_name)])
    assert sorted(removed) == ["tiny_fp32", "tiny_torchscript"]
    assert sorted(p.name for p in populated_repo.iterdir()) == ["other"]


def test_baked_batch_size_fails_naming_tensor_and_axis(populated_repo: Path) -> None:
    before = snapshot(populated_repo)
    with pytest.raises(VerificationError) as info:
        run_export(tiny_spec(BakedBatch), Options(repo=populated_repo), progress=lambda _: None)
    message = str(info.value)
    assert "'y' axis 0 ('batch_size') is fixed to 2" in message
    assert snapshot(populated_repo) == before


def test_verification_failure_mid_export_leaves_repository_unchanged(
    populated_repo: Path,
) -> None:
    before = snapshot(populated_repo)
    with pytest.raises(VerificationError) as info:
        run_export(
            tiny_spec(TraceSpecialised), Options(repo=populated_repo), progress=lambda _: None
        )
    # The grid caught the specialised trace in both formats (seq 1: mean == sum, so seq 2).
    assert "fp32 batch=8 seq=2: output 'y'" in str(info.value)
    assert "torchscript batch=8 seq=2: output 'y'" in str(info.value)
    assert snapshot(populated_repo) == before
    assert not list(staging_parent(populated_repo).glob("*"))


def test_config_cross_check_names_the_mismatch(populated_repo: Path) -> None:
    path = populated_repo / "tiny_fp32" / "config.pbtxt"
    config = pbtxt_to_dict(path.read_text())
    config["input"][0]["data_type"] = "TYPE_INT32"
    config["output"][0]["dims"] = [3, 1]
    io = onnx_io(populated_repo / "tiny_fp32" / "1" / "model.onnx")
    problems = cross_check(config, io, "tiny_fp32/config.pbtxt")
    assert any("input 'x' data_type TYPE_INT32" in p for p in problems)
    assert any("output 'y' rank 2" in p for p in problems)


# -- int8 Q/DQ audit ---------------------------------------------------------------------------
def _matmul_graph(path: Path) -> None:
    """x[b, 8] -> MatMul(W1) -> Relu -> MatMul(W2) -> y[b, 4]; like onnxruntime's quant tests."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "W1")
    w2 = numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "W2")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
            helper.make_node("Relu", ["h"], ["r"], name="relu"),
            helper.make_node("MatMul", ["r", "W2"], ["y"], name="mm2"),
        ],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch_size", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch_size", 4])],
        [w1, w2],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))


@pytest.fixture
def quantized(tmp_path: Path) -> onnx.ModelProto:
    src, dst = tmp_path / "fp32.onnx", tmp_path / "int8.onnx"
    _matmul_graph(src)
    rng = np.random.default_rng(1)
    calib = [{"x": rng.standard_normal((4, 8)).astype(np.float32)} for _ in range(4)]
    quantize_int8(src, dst, Quantization(), calib, tmp_path / "cache.json", target="gpu")
    return onnx.load(str(dst))


def _weight_dq_scale(model: onnx.ModelProto, weight: str) -> tuple[str, onnx.TensorProto]:
    """(DQ node name, its scale initializer) for the quantized weight ``weight``."""
    inits = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0].startswith(weight):
            return node.name, inits[node.input[1]]
    raise AssertionError(f"no DequantizeLinear for {weight}")


def test_audit_accepts_real_quantized_graph(quantized: onnx.ModelProto) -> None:
    problems, counts = audit_qdq(quantized)
    assert problems == []
    # 2 weights (DQ only) + activations of both MatMuls (Q+DQ pairs).
    assert counts["DequantizeLinear"] >= 4 and counts["QuantizeLinear"] >= 2


@pytest.mark.parametrize("bad", [0.0, float("nan")])
def test_audit_names_nodes_with_zero_or_nan_scale(quantized: onnx.ModelProto, bad: float) -> None:
    node, scale = _weight_dq_scale(quantized, "W1")
    values = numpy_helper.to_array(scale).copy()
    values[1] = bad
    scale.CopyFrom(numpy_helper.from_array(values, scale.name))
    problems, _ = audit_qdq(quantized)
    assert problems, "a broken scale passed the audit"
    assert all(node in p for p in problems)
    assert ("non-finite" if np.isnan(bad) else "<= 0") in problems[0]
    with pytest.raises(QuantAuditError, match=node):
        raise QuantAuditError(problems)


def test_audit_flags_tiny_scale_and_bad_axis(quantized: onnx.ModelProto) -> None:
    node1, scale1 = _weight_dq_scale(quantized, "W1")
    values = numpy_helper.to_array(scale1).copy()
    values[:] = 1e-12
    scale1.CopyFrom(numpy_helper.from_array(values, scale1.name))
    node2, _ = _weight_dq_scale(quantized, "W2")
    dq2 = next(n for n in quantized.graph.node if n.name == node2)
    for attr in dq2.attribute:
        if attr.name == "axis":
            attr.i = 5
    problems, _ = audit_qdq(quantized)
    assert any(node1 in p and "below 1e-08" in p for p in problems)
    assert any(node2 in p and "axis 5 invalid for rank 2" in p for p in problems)


@pytest.fixture
def dynamic(tmp_path: Path) -> onnx.ModelProto:
    src, dst = tmp_path / "fp32.onnx", tmp_path / "int8.onnx"
    _matmul_graph(src)
    quantize_int8(src, dst, Quantization(), [], tmp_path / "cache.json")
    return onnx.load(str(dst))


def _weight_scale(model: onnx.ModelProto, weight: str) -> onnx.TensorProto:
    inits = {i.name: i for i in model.graph.initializer}
    return next(t for name, t in inits.items() if name.startswith(weight) and "scale" in name)


def test_dynamic_audit_accepts_real_graph_and_checks_every_matmul(
    dynamic: onnx.ModelProto,
) -> None:
    problems, counts = audit_int8(dynamic)
    assert problems == []
    assert counts["MatMulInteger"] == 2 and counts["DynamicQuantizeLinear"] == 2
    assert counts["QuantizeLinear"] == 0


@pytest.mark.parametrize("bad", [0.0, float("nan"), 1e-12])
def test_dynamic_audit_names_the_matmul_with_a_broken_weight_scale(
    dynamic: onnx.ModelProto, bad: float
) -> None:
    scale = _weight_scale(dynamic, "W2")
    values = numpy_helper.to_array(scale).copy()
    values.reshape(-1)[0] = bad
    scale.CopyFrom(numpy_helper.from_array(values, scale.name))
    problems, _ = audit_dynamic(dynamic)
    assert problems, "a broken scale passed the audit"
    assert all("mm2" in p for p in problems), problems


def test_dynamic_audit_flags_zero_points_that_do_not_match_the_channels(
    dynamic: onnx.ModelProto,
) -> None:
    inits = {i.name: i for i in dynamic.graph.initializer}
    zp = next(t for name, t in inits.items() if name.startswith("W1") and "zero_point" in name)
    values = numpy_helper.to_array(zp)
    zp.CopyFrom(numpy_helper.from_array(np.concatenate([values, values[:1]]), zp.name))
    problems, _ = audit_dynamic(dynamic)
    assert any("mm1" in p and "zero points for 16 channels" in p for p in problems), problems


def test_int8_audit_refuses_a_graph_with_nothing_quantized(tmp_path: Path) -> None:
    _matmul_graph(tmp_path / "fp32.onnx")
    problems, _ = audit_int8(onnx.load(str(tmp_path / "fp32.onnx")))
    assert problems == ["no quantized node in the int8 graph"]


def test_a_change_to_the_core_config_layer_re_exports(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The encoder configs are rendered by the core's config layer: its code is fingerprinted
    with the exporter's own, so changing it re-exports (it would not if only export/ counted)."""
    from tritonforge.export import staging

    for name in staging.CORE_MODULES:
        (tmp_path / name).write_bytes((staging.CORE_ROOT / name).read_bytes())
    monkeypatch.setattr(staging, "CORE_ROOT", tmp_path)
    before = staging.code_digest()
    (tmp_path / "configschema.py").write_text("# another renderer\n")
    assert staging.code_digest() != before
