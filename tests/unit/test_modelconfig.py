"""config.pbtxt as a typed contract."""

from __future__ import annotations

import numpy as np
import pytest

from tritonforge.errors import ModelConfigError
from tritonforge.modelconfig import ModelConfig, pbtxt_to_dict, triton_dtype_of, wire_dtype

PBTXT = """
name: "enc"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "ids" data_type: TYPE_INT64 dims: [ -1 ] } ]
output [ { name: "emb" data_type: TYPE_FP32 dims: [ 384 ] } ]
parameters { key: "max_length" value: { string_value: "256" } }
parameters { key: "fast" value: { string_value: "true" } }
"""


def test_pbtxt_parses_with_tritons_schema() -> None:
    config = ModelConfig.from_pbtxt(PBTXT)
    assert config.name == "enc" and config.max_batch_size == 8 and config.batched
    assert config.input("ids").dims == (-1,)
    assert config.input("ids").numpy_dtype is np.int64
    assert config.output("emb").full_shape(batched=True) == (-1, 384)
    assert config.param("max_length", kind=int) == 256
    assert config.param("fast", kind=bool) is True
    assert config.param("missing", 3, int) == 3


def test_missing_required_parameter_names_it() -> None:
    config = ModelConfig.from_pbtxt(PBTXT)
    with pytest.raises(ModelConfigError, match=r"parameters\.tokenizer_file is required"):
        config.param("tokenizer_file")
    with pytest.raises(ModelConfigError, match=r"parameters\.max_length='x' is not a valid int"):
        ModelConfig.from_json(
            {**pbtxt_to_dict(PBTXT), "parameters": {"max_length": {"string_value": "x"}}}
        ).param("max_length", kind=int)


def test_bad_pbtxt_is_a_config_error() -> None:
    with pytest.raises(ModelConfigError, match="does not parse"):
        pbtxt_to_dict("name: enc\nmax_batch_size: [")


def test_dtype_maps() -> None:
    assert triton_dtype_of(np.float32) == "TYPE_FP32"
    assert triton_dtype_of(np.object_) == "TYPE_STRING"
    assert wire_dtype("TYPE_STRING") == "BYTES"
    assert wire_dtype("TYPE_INT64") == "INT64"
    with pytest.raises(ModelConfigError):
        triton_dtype_of(np.complex64)
