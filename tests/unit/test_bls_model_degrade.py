"""The BLS model's routing with degradation, run in-process over a stand-in of the stub's
``triton_python_backend_utils`` (the real model against the real server:
tests/integration/test_degrade.py). The stand-in encoders answer a constant per variant, so
every answer shows which encoder produced it."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tritonforge.export.pipeline_configs import write_pipeline
from tritonforge.export.specs import get_pipeline
from tritonforge.export.tritonconfig import render_pbtxt
from tritonforge.modelconfig import pbtxt_to_dict

DIM = 384
VALUE = {"encoder_fp32": 1.0, "encoder_int8": 2.0}


class Tensor:
    def __init__(self, name: str, value: np.ndarray) -> None:
        self._name, self._value = name, value

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._value


class TritonError:
    INVALID_ARG, UNAVAILABLE, INTERNAL = "INVALID_ARG", "UNAVAILABLE", "INTERNAL"

    def __init__(self, message: str, code: str = "INTERNAL") -> None:
        self._message, self._code = message, code

    def message(self) -> str:
        return self._message

    def code(self) -> str:
        return self._code


class Response:
    def __init__(self, output_tensors: list[Tensor] | None = None, error: Any = None) -> None:
        self.tensors = {t.name(): t for t in output_tensors or []}
        self.error_ = error

    def has_error(self) -> bool:
        return self.error_ is not None

    def error(self) -> Any:
        return self.error_


class Stub(ModuleType):
    """What the BLS uses of pb_utils; ``refuse`` makes a model answer Triton's queue refusal."""

    def __init__(self) -> None:
        super().__init__("triton_python_backend_utils")
        self.Tensor, self.TritonError, self.InferenceResponse = Tensor, TritonError, Response
        self.refuse: set[str] = set()
        self.calls: list[str] = []
        self.counted: dict[str, int] = {}
        stub = self

        class InferenceRequest:
            def __init__(self, model_name: str, inputs: list[Tensor], **_: Any) -> None:
                self.model, self.rows = model_name, len(inputs[0].as_numpy())

            def exec(self) -> Response:
                stub.calls.append(self.model)
                if self.model in stub.refuse:
                    return Response(error=TritonError("Exceeds maximum queue size", "UNAVAILABLE"))
                out = np.full((self.rows, DIM), VALUE[self.model], np.float32)
                return Response([Tensor("sentence_embedding", out)])

        class MetricFamily:
            COUNTER = "counter"

            def __init__(self, **_: Any) -> None:
                pass

            def Metric(self, labels: dict[str, str]) -> Any:
                def increment(n: int) -> None:
                    stub.counted[labels["to"]] = stub.counted.get(labels["to"], 0) + n

                return SimpleNamespace(increment=increment)

        self.InferenceRequest, self.MetricFamily = InferenceRequest, MetricFamily

    @staticmethod
    def get_input_tensor_by_name(request: Any, name: str) -> Tensor:
        return request.inputs[name]

    @staticmethod
    def get_output_tensor_by_name(response: Response, name: str) -> Tensor | None:
        return response.tensors.get(name)


class Request:
    def __init__(self, texts: list[str], **params: str) -> None:
        value = np.array([[t.encode()] for t in texts], dtype=np.object_)
        self.inputs = {"text": Tensor("text", value)}
        self._params = json.dumps(params)

    def parameters(self) -> str:
        return self._params

    def request_id(self) -> str:
        return ""

    def trace(self) -> None:
        return None


@pytest.fixture
def bls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Stub]:
    """The generated embed_bls model over stand-in fp32/int8 encoder configs, initialised."""
    root = tmp_path / "repo"
    tensors = ", ".join(
        f'{{ name: "{n}" data_type: TYPE_INT64 dims: [ -1 ] }}'
        for n in ("input_ids", "attention_mask", "token_type_ids")
    )
    for name in VALUE:
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 64\n'
            f"input [ {tensors} ]\n"
            f'output [ {{ name: "sentence_embedding" data_type: TYPE_FP32 dims: [ {DIM} ] }} ]\n'
        )
    write_pipeline(get_pipeline("minilm"), root)
    config = pbtxt_to_dict((root / "embed_bls" / "config.pbtxt").read_text())
    config["parameters"]["encoder_models"]["string_value"] = "fp32=encoder_fp32,int8=encoder_int8"
    (root / "embed_bls" / "config.pbtxt").write_text(render_pbtxt(config))
    stub = Stub()
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", stub)
    source = root / "embed_bls" / "1" / "model.py"
    spec = importlib.util.spec_from_file_location("bls_model_under_test", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.TritonPythonModel()
    model.initialize(
        {"model_config": json.dumps(config), "model_repository": str(root / "embed_bls")}
    )
    return model, stub


def answered(responses: list[Response]) -> list[str]:
    """Per response: the variant output, checked against the encoder that computed it."""
    out = []
    for r in responses:
        assert not r.has_error(), r.error().message()
        variant = r.tensors["variant"].as_numpy().reshape(-1)[0].decode()
        embedding = r.tensors["embedding"].as_numpy()
        assert np.all(embedding == VALUE[f"encoder_{variant}"]), variant
        out.append(variant)
    return out


def test_a_backlog_degrades_only_the_requests_that_allow_it(bls: tuple[Any, Stub]) -> None:
    model, stub = bls
    calm = model.execute([Request(["one"], fallback="int8")])
    assert answered(calm) == ["fp32"]  # one request waiting: not overloaded
    backlog = [Request([f"t{i}"]) for i in range(3)]
    backlog += [Request(["x"], fallback="int8"), Request(["y"], fallback="int8")]
    assert answered(model.execute(backlog)) == ["fp32"] * 3 + ["int8"] * 2
    assert stub.counted == {"int8": 2}


def test_a_refused_fp32_call_is_retried_on_int8_for_those_who_allow_it(
    bls: tuple[Any, Stub],
) -> None:
    model, stub = bls
    stub.refuse.add("encoder_fp32")
    responses = model.execute([Request(["a"], fallback="int8"), Request(["b"])])
    assert answered(responses[:1]) == ["int8"]
    assert responses[1].has_error()
    assert "Exceeds maximum queue size" in responses[1].error().message()
    assert responses[1].error().code() == "UNAVAILABLE"  # refused as today
    assert stub.counted == {"int8": 1}


def test_a_bad_fallback_fails_alone(bls: tuple[Any, Stub]) -> None:
    model, _ = bls
    responses = model.execute([Request(["a"], fallback="fp16"), Request(["b"])])
    assert responses[0].has_error() and "'fallback'" in responses[0].error().message()
    assert responses[0].error().code() == "INVALID_ARG"
    assert answered(responses[1:]) == ["fp32"]
