"""The model configuration as a typed contract.

Triton hands a Python model its configuration as JSON (``args["model_config"]``). Everything a
model needs (tensor names, dtypes, dims, ``max_batch_size`` and knobs in ``parameters``) is read
from there through this module, never repeated as literals in ``model.py``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from tritonforge.errors import ModelConfigError

# Triton data types <-> numpy dtypes. BYTES tensors are numpy object arrays of ``bytes``.
TRITON_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": np.bool_,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}
NUMPY_TO_TRITON: dict[Any, str] = {np.dtype(v): k for k, v in TRITON_TO_NUMPY.items()}

T = TypeVar("T", int, float, str, bool)


def triton_dtype_of(dtype: Any) -> str:
    """``TYPE_*`` name of a numpy dtype (``object``/``bytes`` map to ``TYPE_STRING``)."""
    dt = np.dtype(dtype)
    if dt.kind in ("S", "U", "O"):
        return "TYPE_STRING"
    try:
        return NUMPY_TO_TRITON[dt]
    except KeyError as e:
        raise ModelConfigError(f"numpy dtype {dt} has no Triton equivalent") from e


def wire_dtype(triton_type: str) -> str:
    """Protocol spelling of a config dtype: ``TYPE_FP32`` -> ``FP32``, STRING -> ``BYTES``."""
    name = triton_type.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a model config. ``dims`` excludes the batch axis; -1 is dynamic."""

    name: str
    data_type: str
    dims: tuple[int, ...]
    optional: bool = False
    label_filename: str = ""

    @property
    def numpy_dtype(self) -> Any:
        try:
            return TRITON_TO_NUMPY[self.data_type]
        except KeyError as e:
            raise ModelConfigError(
                f"tensor {self.name!r}: unsupported data_type {self.data_type!r}"
            ) from e

    @property
    def wire_dtype(self) -> str:
        return wire_dtype(self.data_type)

    def full_shape(self, batched: bool) -> tuple[int, ...]:
        """Shape including the batch axis (-1) when the model batches."""
        return ((-1,) if batched else ()) + self.dims

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> TensorSpec:
        try:
            name = str(obj["name"])
        except KeyError as e:
            raise ModelConfigError("a tensor in the model config has no name") from e
        dims = obj.get("dims", [])
        reshape = obj.get("reshape")
        if reshape and reshape.get("shape") is not None:
            dims = reshape["shape"]
        return cls(
            name=name,
            data_type=str(obj.get("data_type", "TYPE_INVALID")),
            dims=tuple(int(d) for d in dims),
            optional=bool(obj.get("optional", False)),
            label_filename=str(obj.get("label_filename", "")),
        )


@dataclass(frozen=True)
class ModelConfig:
    """The parts of a Triton model config that models and backends act on."""

    name: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    parameters: Mapping[str, str] = field(default_factory=dict)
    default_model_filename: str = ""
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @property
    def batched(self) -> bool:
        return self.max_batch_size > 0

    def input(self, name: str) -> TensorSpec:
        for spec in self.inputs:
            if spec.name == name:
                return spec
        raise ModelConfigError(f"model {self.name!r} has no input {name!r}")

    def output(self, name: str) -> TensorSpec:
        for spec in self.outputs:
            if spec.name == name:
                return spec
        raise ModelConfigError(f"model {self.name!r} has no output {name!r}")

    def param(self, key: str, default: T | None = None, kind: type[T] = str) -> T:  # type: ignore[assignment]
        """A value of ``parameters``, converted to ``kind``; missing -> ``default`` or an error."""
        raw = self.parameters.get(key)
        if raw is None or raw == "":
            if default is None:
                raise ModelConfigError(
                    f"model {self.name!r}: parameters.{key} is required in config.pbtxt"
                )
            return default
        try:
            if kind is bool:
                return raw.strip().lower() in ("1", "true", "yes", "on")
            return kind(raw)
        except ValueError as e:
            raise ModelConfigError(
                f"model {self.name!r}: parameters.{key}={raw!r} is not a valid {kind.__name__}"
            ) from e

    @classmethod
    def from_json(cls, config: str | Mapping[str, Any]) -> ModelConfig:
        """Parse the JSON form Triton passes to ``initialize`` (``args["model_config"]``)."""
        obj: Mapping[str, Any] = json.loads(config) if isinstance(config, str) else config
        params = {
            str(k): str(v.get("string_value", "")) if isinstance(v, Mapping) else str(v)
            for k, v in (obj.get("parameters") or {}).items()
        }
        return cls(
            name=str(obj.get("name", "")),
            max_batch_size=int(obj.get("max_batch_size", 0)),
            inputs=tuple(TensorSpec.from_json(t) for t in obj.get("input", [])),
            outputs=tuple(TensorSpec.from_json(t) for t in obj.get("output", [])),
            parameters=params,
            default_model_filename=str(obj.get("default_model_filename", "")),
            raw=obj,
        )

    @classmethod
    def from_pbtxt(cls, text: str) -> ModelConfig:
        """Parse a ``config.pbtxt`` with Triton's protobuf schema (needs ``tritonclient``)."""
        return cls.from_json(pbtxt_to_dict(text))


def pbtxt_to_dict(text: str) -> dict[str, Any]:
    """Parse ``config.pbtxt`` text with Triton's ``model_config_pb2`` into Triton's JSON form."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    try:
        msg = text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as e:
        raise ModelConfigError(f"config.pbtxt does not parse: {e}") from e
    result: dict[str, Any] = json_format.MessageToDict(
        msg, preserving_proto_field_name=True, use_integers_for_enums=False
    )
    # Triton's own JSON keeps TYPE_* enum names and integer dims; MessageToDict gives int64 as str.
    for key in ("input", "output"):
        for t in result.get(key, []):
            t["dims"] = [int(d) for d in t.get("dims", [])]
    return result
