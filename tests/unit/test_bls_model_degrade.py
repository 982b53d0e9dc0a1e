"""The BLS model's routing with degradation, its concurrent encoder calls and its early answers,
run in-process over a stand-in of the stub's ``triton_python_backend_utils`` (the real model
against the real server: tests/integration/test_degrade.py). The stand-in encoders answer a
constant per variant, so every answer shows which encoder produced it."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
from collections.abc import Callable
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
        self.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
        self.refuse: set[str] = set()
        self.calls: list[str] = []
        self.before_exec: Callable[[int], None] = lambda rows_length: None
        self.counted: dict[str, int] = {}
        stub = self

        class InferenceRequest:
            def __init__(self, model_name: str, inputs: list[Tensor], **_: Any) -> None:
                self.model, self.rows = model_name, len(inputs[0].as_numpy())
                self.length = inputs[0].as_numpy().shape[1]

            def exec(self) -> Response:
                stub.before_exec(self.length)
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


class Sender:
    """A request's response sender: records what was sent and signals the answer."""

    def __init__(self) -> None:
        self.sent: list[tuple[Response, int]] = []
        self.answered = threading.Event()

    def send(self, response: Response, flags: int = 0) -> None:
        self.sent.append((response, flags))
        self.answered.set()


class Request:
    def __init__(self, texts: list[str], **params: str) -> None:
        value = np.array([[t.encode()] for t in texts], dtype=np.object_)
        self.inputs = {"text": Tensor("text", value)}
        self._params = json.dumps(params)
        self.sender = Sender()

    def get_response_sender(self) -> Sender:
        return self.sender

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
            "instance_group [ { count: 2 kind: KIND_CPU } ]\n"
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


def execute(model: Any, requests: list[Request]) -> list[Response]:
    """Run one execute; each request's one response, which it sent with the final flag."""
    assert model.execute(requests) is None  # answered through the response senders
    for r in requests:
        assert [flags for _, flags in r.sender.sent] == [1], "exactly one final response"
    return [r.sender.sent[0][0] for r in requests]


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
    calm = execute(model, [Request(["one"], fallback="int8")])
    assert answered(calm) == ["fp32"]  # one request waiting: not overloaded
    backlog = [Request([f"t{i}"]) for i in range(3)]
    backlog += [Request(["x"], fallback="int8"), Request(["y"], fallback="int8")]
    assert answered(execute(model, backlog)) == ["fp32"] * 3 + ["int8"] * 2
    assert stub.counted == {"int8": 2}


def test_a_refused_fp32_call_is_retried_on_int8_for_those_who_allow_it(
    bls: tuple[Any, Stub],
) -> None:
    model, stub = bls
    stub.refuse.add("encoder_fp32")
    responses = execute(model, [Request(["a"], fallback="int8"), Request(["b"])])
    assert answered(responses[:1]) == ["int8"]
    assert responses[1].has_error()
    assert "Exceeds maximum queue size" in responses[1].error().message()
    assert responses[1].error().code() == "UNAVAILABLE"  # refused as today
    assert stub.counted == {"int8": 1}


def test_a_bad_fallback_fails_alone(bls: tuple[Any, Stub]) -> None:
    model, _ = bls
    responses = execute(model, [Request(["a"], fallback="fp16"), Request(["b"])])
    assert responses[0].has_error() and "'fallback'" in responses[0].error().message()
    assert responses[0].error().code() == "INVALID_ARG"
    assert answered(responses[1:]) == ["fp32"]


SHORT, LONG = "short", " ".join(["word"] * 40)  # 16 and 48 tokens: two encoder calls


def test_the_encoder_calls_of_one_execute_overlap(bls: tuple[Any, Stub]) -> None:
    model, stub = bls
    both = threading.Barrier(2)
    stub.before_exec = lambda _length: both.wait(timeout=10)  # breaks unless 2 calls run at once
    assert answered(execute(model, [Request([SHORT]), Request([LONG])])) == ["fp32", "fp32"]
    assert stub.calls == ["encoder_fp32", "encoder_fp32"]


def test_a_call_s_requests_are_answered_before_a_slower_call_ends(bls: tuple[Any, Stub]) -> None:
    model, stub = bls
    short, long = Request([SHORT]), Request([LONG])
    seen: list[bool] = []

    def slow_long_call(length: int) -> None:
        if length > 16:  # the long call ends only after the short one's answer went out
            seen.append(short.sender.answered.wait(timeout=10))

    stub.before_exec = slow_long_call
    assert answered(execute(model, [long, short])) == ["fp32", "fp32"]
    assert seen == [True]


def test_an_unexpected_failure_still_answers_every_request_once(
    bls: tuple[Any, Stub], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, _ = bls

    def broken(*_: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(model, "_calls", broken)
    responses = execute(model, [Request(["a"]), Request(["b"], fallback="x")])
    assert responses[0].error().code() == "INTERNAL"
    assert "internal error (RuntimeError)" in responses[0].error().message()
    assert responses[1].error().code() == "INVALID_ARG"  # answered before the failure
