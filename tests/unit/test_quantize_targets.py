"""int8 per deployment target: the spec's methods, the GPU target's static QDQ graph beside the
CPU's dynamic one, the configs generated for each, and deploy-check's TensorRT INT8 checks."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

from tests.unit.test_export import _matmul_graph
from tritonforge.deploy import gpu_check
from tritonforge.deploy.validate import (
    gpu_config_findings,
    gpu_config_notes,
    tensorrt_int8_findings,
    tensorrt_parameter_findings,
)
from tritonforge.export.encoder import Options, planned_artifacts, run_export
from tritonforge.export.errors import ExportError, SpecError
from tritonforge.export.quantize import quantize_int8
from tritonforge.export.spec import (
    BATCH_AXIS,
    CPU_TARGET,
    GPU_TARGET,
    ExportSpec,
    Inputs,
    QualityGate,
    Quantization,
    Serving,
    TensorDecl,
)
from tritonforge.export.specs import get_pipeline
from tritonforge.modelconfig import pbtxt_to_dict

GPU = Path("configs") / "gpu.pbtxt"


# -- the spec ---------------------------------------------------------------------------------
def test_default_quantization_is_dynamic_on_cpu_and_static_qdq_for_tensorrt() -> None:
    q = Quantization()
    assert q.method(CPU_TARGET) == "dynamic" and q.method(GPU_TARGET) == "static_qdq"
    assert q.own_targets() == (GPU_TARGET,)
    assert q.artifact_name(CPU_TARGET) == "model.onnx"
    assert q.artifact_name(GPU_TARGET) == "model.static_qdq.onnx"
    same = Quantization(methods=((CPU_TARGET, "dynamic"), (GPU_TARGET, "dynamic")))
    assert same.own_targets() == () and same.artifact_name(GPU_TARGET) == "model.onnx"
    only_cpu = Quantization(methods=((CPU_TARGET, "static_qdq"),))
    assert only_cpu.method(GPU_TARGET) == "static_qdq"  # a target without its own: the CPU's
    kept = Quantization(keep_fp32=("a",), keep_fp32_by_target=((GPU_TARGET, ("b", "c")),))
    assert kept.kept_fp32(CPU_TARGET) == ("a",) and kept.kept_fp32(GPU_TARGET) == ("b", "c")


@pytest.mark.parametrize(
    "methods",
    [
        ((GPU_TARGET, "static_qdq"),),  # no cpu
        ((CPU_TARGET, "dynamic"), (CPU_TARGET, "static_qdq")),  # twice
        ((CPU_TARGET, "dynamic"), ("tpu", "static_qdq")),
        ((CPU_TARGET, "int4"),),
    ],
)
def test_quantization_methods_are_validated(methods: tuple[tuple[str, str], ...]) -> None:
    with pytest.raises(ValueError, match="quantization method"):
        Quantization(methods=methods)


@pytest.mark.parametrize("name", ["minilm", "sentiment"])
def test_default_pipelines_declare_a_tensorrt_int8_method(name: str) -> None:
    if name == "sentiment" and not Path("build/classifier/v1/config.json").is_file():
        pytest.skip(reason="the default classifier is not trained here (make classifier)")
    q = get_pipeline(name).encoder.quantization
    assert q.method(CPU_TARGET) == "dynamic" and q.method(GPU_TARGET) == "static_qdq"
    assert q.kept_fp32(GPU_TARGET), "the measured GPU exclusions skip the search on re-export"


def test_export_targets_are_validated() -> None:
    with pytest.raises(SpecError, match="targets"):
        Options(repo=Path("r"), targets=(GPU_TARGET,))
    with pytest.raises(SpecError, match="targets"):
        Options(repo=Path("r"), targets=(CPU_TARGET, "tpu"))


# -- quantize_int8 by target --------------------------------------------------------------------
def _ops(model: onnx.ModelProto) -> set[str]:
    return {n.op_type for n in model.graph.node}


@pytest.fixture
def graphs(tmp_path: Path) -> dict[str, onnx.ModelProto]:
    """The tiny MatMul graph quantized by each target's method (and asymmetrically)."""
    src = tmp_path / "fp32.onnx"
    _matmul_graph(src)
    rng = np.random.default_rng(1)
    calib = [{"x": rng.standard_normal((4, 8)).astype(np.float32)} for _ in range(4)]
    out = {}
    asym = Quantization(symmetric=False, activation_type="QUInt8")
    for label, q, target in (
        ("cpu", Quantization(), CPU_TARGET),
        ("gpu", Quantization(), GPU_TARGET),
        ("asym", asym, GPU_TARGET),
    ):
        dst = tmp_path / f"{label}.onnx"
        quantize_int8(src, dst, q, calib, tmp_path / f"{label}.json", target=target)
        out[label] = onnx.load(str(dst))
    return out


def test_gpu_target_gets_symmetric_int8_qdq_and_cpu_dynamic(
    graphs: dict[str, onnx.ModelProto],
) -> None:
    assert {"MatMulInteger", "DynamicQuantizeLinear"} <= _ops(graphs["cpu"])
    gpu = graphs["gpu"]
    assert "MatMulInteger" not in _ops(gpu) and "QuantizeLinear" in _ops(gpu)
    inits = {i.name: numpy_helper.to_array(i) for i in gpu.graph.initializer}
    zero_points = [
        inits[n.input[2]] for n in gpu.graph.node if n.op_type.endswith("QuantizeLinear")
    ]
    assert zero_points and all(z.dtype == np.int8 and not z.any() for z in zero_points)


def test_tensorrt_int8_check_accepts_the_qdq_graph(graphs: dict[str, onnx.ModelProto]) -> None:
    assert tensorrt_int8_findings("m", graphs["gpu"], {"precision_mode": "INT8"}) == []


def test_tensorrt_int8_check_refuses_the_dynamic_graph(graphs: dict[str, onnx.ModelProto]) -> None:
    """The regression: the CPU's dynamic int8 graph handed to TensorRT INT8."""
    findings = tensorrt_int8_findings("m", graphs["cpu"], {"precision_mode": "INT8"})
    assert any("MatMulInteger" in f and "DynamicQuantizeLinear" in f for f in findings), findings
    assert any("no Q/DQ node" in f for f in findings)


def test_tensorrt_int8_check_refuses_asymmetric_uint8(graphs: dict[str, onnx.ModelProto]) -> None:
    findings = tensorrt_int8_findings("m", graphs["asym"], {"precision_mode": "INT8"})
    assert any("uint8" in f and "signed int8" in f for f in findings), findings


def test_tensorrt_int8_check_wants_pairs_on_every_input(
    graphs: dict[str, onnx.ModelProto],
) -> None:
    model, model2 = onnx.ModelProto(), onnx.ModelProto()
    model.CopyFrom(graphs["gpu"])
    model2.CopyFrom(graphs["gpu"])
    producer = {o: n for n in model.graph.node for o in n.output}
    matmul = next(n for n in model.graph.node if n.op_type == "MatMul")
    dq = producer[matmul.input[0]]
    matmul.input[0] = producer[dq.input[0]].input[0]  # the activation in float, Q/DQ bypassed
    findings = tensorrt_int8_findings("m", model, {"precision_mode": "INT8"})
    assert any(matmul.name in f and "one in float" in f for f in findings), findings
    # a DequantizeLinear of a float activation with no QuantizeLinear before it
    q = next(n for n in model2.graph.node if n.op_type == "QuantizeLinear")
    lone = helper.make_node("Identity", [q.input[0]], ["not_quantized"], name="lone")
    model2.graph.node.append(lone)
    for node in model2.graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0] == q.output[0]:
            node.input[0] = "not_quantized"
    findings = tensorrt_int8_findings("m", model2, {"precision_mode": "INT8"})
    assert any("not paired with a QuantizeLinear" in f for f in findings), findings


def test_tensorrt_int8_check_refuses_a_calibration_table_on_qdq(
    graphs: dict[str, onnx.ModelProto],
) -> None:
    params = {"precision_mode": "INT8", "int8_calibration_table_name": "calib.flatbuffers"}
    findings = tensorrt_int8_findings("m", graphs["gpu"], params)
    assert any("int8_calibration_table_name on a Q/DQ graph" in f for f in findings)


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"precision_mode": "FP8"}, "precision_mode 'FP8'"),
        ({"segment_size": "3"}, "unknown TensorRT parameter 'segment_size'"),
        ({"max_workspace_size_bytes": "1GB"}, "not an integer"),
        ({"max_workspace_size_bytes": "0"}, "must be > 0"),
        ({"trt_engine_cache_enable": "yes please"}, "trt_engine_cache_enable"),
        ({"trt_engine_cache_enable": "1"}, "without trt_engine_cache_path"),
        ({"trt_engine_cache_path": "trt_cache"}, "must be absolute"),
        ({"trt_timing_cache_path": "/models/x"}, "read-only"),
    ],
)
def test_tensorrt_parameters_must_be_well_formed(params: dict[str, str], expected: str) -> None:
    findings = tensorrt_parameter_findings("m", params)
    assert any(expected in f for f in findings), findings


def test_tensorrt_parameters_of_the_generated_configs_pass() -> None:
    params = {
        "precision_mode": "INT8",
        "max_workspace_size_bytes": str(1 << 30),
        "trt_engine_cache_enable": "1",
        "trt_engine_cache_path": "/tmp/trt_cache",
    }
    assert tensorrt_parameter_findings("m", params) == []


# -- the export writes both graphs and a GPU config for each ------------------------------------
class Projected(torch.nn.Module):
    """[batch, seq, 4] -> Linear (a MatMul with a constant weight) -> mean over seq -> [batch, 3]."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).mean(dim=1)


def _examples(lengths: Sequence[int], rng: np.random.Generator) -> Inputs:
    return {"x": rng.standard_normal((len(lengths), max(lengths), 4)).astype(np.float32)}


def _corpus() -> list[Inputs]:
    rng = np.random.default_rng(3)
    return [_examples((5, 5, 5), rng) for _ in range(4)]


def int8_spec() -> ExportSpec:
    return ExportSpec(
        name="tiny8",
        description="tiny int8 test module",
        build_module=Projected,
        inputs=(TensorDecl("x", "float32", (BATCH_AXIS, "sequence_length", 4)),),
        outputs=(TensorDecl("y", "float32", (BATCH_AXIS, 3), atol=1e-5, rtol=1e-4),),
        example_inputs=_examples,
        max_batch=8,
        max_length=16,
        trace_lengths=(6, 6),
        grid=((1, 1), (2, 5), (8, 2)),
        benchmark_lengths=(4, 4),
        calibration=_corpus,
        evaluation=_corpus,
        quality_gate=QualityGate("y", mean_cosine_min=0.9, min_cosine_min=0.5),
        serving=Serving(fp32_name="tiny8_fp32", int8_name="tiny8_int8"),
    )


def _export(repo: Path, targets: tuple[str, ...]) -> None:
    options = Options(repo=repo, formats=("onnx",), quantize="int8", targets=targets)
    run_export(int8_spec(), options, progress=lambda _: None)


def test_gpu_target_export_serves_the_qdq_graph_to_tensorrt_int8(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _export(repo, (CPU_TARGET, GPU_TARGET))
    version = repo / "tiny8_int8" / "1"
    cpu, gpu = (
        onnx.load(str(version / "model.onnx")),
        onnx.load(str(version / "model.static_qdq.onnx")),
    )
    assert "MatMulInteger" in _ops(cpu) and "MatMulInteger" not in _ops(gpu)
    assert "QuantizeLinear" in _ops(gpu)
    base = pbtxt_to_dict((repo / "tiny8_int8" / "config.pbtxt").read_text())
    config = pbtxt_to_dict((repo / "tiny8_int8" / GPU).read_text())
    assert base["default_model_filename"] == "model.onnx"
    assert config["default_model_filename"] == "model.static_qdq.onnx"
    accelerator = config["optimization"]["execution_accelerators"]["gpu_execution_accelerator"][0]
    assert accelerator["parameters"]["precision_mode"] == "INT8"
    assert gpu_config_findings(repo / "tiny8_int8") == []
    assert gpu_config_findings(repo / "tiny8_fp32") == []
    assert "TensorRT INT8 on model.static_qdq.onnx" in gpu_config_notes(repo / "tiny8_int8")[0]
    report = (version / "export_report.md").read_text()
    assert "int8 for gpu hosts (static_qdq, model.static_qdq.onnx)" in report
    planned = planned_artifacts(
        int8_spec(), Options(repo=repo, formats=("onnx",), quantize="int8", targets=("cpu", "gpu"))
    )
    assert planned["tiny8_int8 (gpu)"] == "tiny8_int8/1/model.static_qdq.onnx"
    # a CPU-only export afterwards is up to date: it skips and the GPU graph stays served
    outcome = run_export(
        int8_spec(),
        Options(repo=repo, formats=("onnx",), quantize="int8"),
        progress=lambda _: None,
    )
    assert outcome.skipped and (version / "model.static_qdq.onnx").is_file()
    assert gpu_config_findings(repo / "tiny8_int8") == []

    # the regression: the GPU config pointed at the dynamic graph again
    (repo / "tiny8_int8" / GPU).write_text(
        (repo / "tiny8_int8" / GPU).read_text().replace('"model.static_qdq.onnx"', '"model.onnx"')
    )
    findings = gpu_config_findings(repo / "tiny8_int8")
    assert any("MatMulInteger" in f and "--target gpu" in f for f in findings), findings


def test_cpu_only_export_keeps_dynamic_int8_off_tensorrt(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _export(repo, (CPU_TARGET,))
    assert not (repo / "tiny8_int8" / "1" / "model.static_qdq.onnx").exists()
    assert "optimization" not in pbtxt_to_dict((repo / "tiny8_int8" / GPU).read_text())
    _export(repo, (CPU_TARGET, GPU_TARGET))  # asking for the GPU target later builds it
    assert (repo / "tiny8_int8" / "1" / "model.static_qdq.onnx").is_file()
    repo = tmp_path / "cpu_only"
    _export(repo, (CPU_TARGET,))
    config = pbtxt_to_dict((repo / "tiny8_int8" / GPU).read_text())
    assert "optimization" not in config
    assert {g["kind"] for g in config["instance_group"]} == {"KIND_CPU"}
    assert gpu_config_findings(repo / "tiny8_int8") == []
    assert "stays on the host CPU" in gpu_config_notes(repo / "tiny8_int8")[0]
    # the fp32 graph still goes to TensorRT (FP16, as before)
    fp32 = pbtxt_to_dict((repo / "tiny8_fp32" / GPU).read_text())
    accelerator = fp32["optimization"]["execution_accelerators"]["gpu_execution_accelerator"][0]
    assert accelerator["parameters"]["precision_mode"] == "FP16"


def test_gpu_config_serving_a_missing_file_is_a_finding(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _export(repo, (CPU_TARGET, GPU_TARGET))
    (repo / "tiny8_int8" / "1" / "model.static_qdq.onnx").unlink()
    findings = gpu_config_findings(repo / "tiny8_int8")
    assert any("serves model.static_qdq.onnx, which is not in" in f for f in findings), findings


def test_gpu_config_dims_must_match_the_served_graph(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _export(repo, (CPU_TARGET, GPU_TARGET))
    for name in ("config.pbtxt", str(GPU)):
        path = repo / "tiny8_int8" / name
        path.write_text(path.read_text().replace("dims: 3", "dims: 5"))
    findings = gpu_config_findings(repo / "tiny8_int8")
    assert any("y dims [5]" in f and "[3]" in f for f in findings), findings


def test_cpu_fallback_must_not_ask_for_a_gpu_accelerator(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _export(repo, (CPU_TARGET,))
    fp32 = (repo / "tiny8_fp32" / GPU).read_text()
    (repo / "tiny8_fp32" / GPU).write_text(fp32.replace("KIND_GPU", "KIND_CPU"))
    findings = gpu_config_findings(repo / "tiny8_fp32")
    assert any("KIND_GPU" in f for f in findings), findings


def test_gpu_check_follows_each_gpu_config(tmp_path: Path) -> None:
    """``make gpu-check`` runs the file and precision the GPU config serves (or skips a model kept
    on the CPU), so on a GPU host it measures what Triton would load."""
    repo = tmp_path / "repo"
    _export(repo, (CPU_TARGET, GPU_TARGET))
    plan = gpu_check.gpu_plan(repo / "tiny8_int8")
    assert (plan.file.name, plan.precision, plan.on_cpu) == ("model.static_qdq.onnx", "INT8", False)
    options = gpu_check.provider_options(gpu_check.TENSORRT, tmp_path, plan.precision)
    assert options["trt_int8_enable"] and not options["trt_fp16_enable"]
    fp32 = gpu_check.gpu_plan(repo / "tiny8_fp32")
    assert (fp32.file.name, fp32.precision) == ("model.onnx", "FP16")
    cpu_only = tmp_path / "cpu_only"
    _export(cpu_only, (CPU_TARGET,))
    assert gpu_check.gpu_plan(cpu_only / "tiny8_int8").on_cpu


def test_notes_name_the_nodes_tensorrt_leaves_to_cuda(tmp_path: Path) -> None:
    """ONNX Runtime's fused operators (the optimised fp32 graphs) are named in the output."""
    repo = tmp_path / "repo"
    _export(repo, (CPU_TARGET,))
    path = repo / "tiny8_fp32" / "1" / "model.onnx"
    assert "own operators" not in gpu_config_notes(repo / "tiny8_fp32")[0]
    model = onnx.load(str(path))
    model.graph.node[0].domain = "com.microsoft"
    onnx.save(model, str(path))
    note = gpu_config_notes(repo / "tiny8_fp32")[0]
    assert f"ONNX Runtime's own operators ({model.graph.node[0].op_type})" in note, note


def test_export_cli_target_flag_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from tritonforge.export import cli

    pipeline = get_pipeline("minilm")
    gpu = cli.options_for(pipeline, cli.parse_args(["minilm", "--target", "gpu"]))
    assert gpu.targets == (CPU_TARGET, GPU_TARGET) and gpu.quantize == "int8"
    assert cli.options_for(pipeline, cli.parse_args(["minilm"])).targets == (CPU_TARGET,)
    monkeypatch.setenv(cli.TARGET_ENV, "gpu")
    assert cli.options_for(pipeline, cli.parse_args(["minilm"])).targets == (CPU_TARGET, GPU_TARGET)
    monkeypatch.setenv(cli.TARGET_ENV, "tpu")
    with pytest.raises(ExportError, match="TRITONFORGE_EXPORT_TARGET='tpu'"):
        cli.options_for(pipeline, cli.parse_args(["minilm"]))
