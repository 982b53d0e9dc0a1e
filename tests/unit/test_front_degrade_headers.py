"""runtime.front.degrade_headers: X-Fallback / X-Priority -> request parameters, and the variant that
answered -> X-Tritonforge-Variant."""

from __future__ import annotations

import json
import struct

import pytest

from tritonforge.runtime.errors import FrontError
from tritonforge.runtime.front.body import add_parameters
from tritonforge.runtime.front.degrade_headers import answered_variant, header_parameters


def test_headers_become_parameters_and_the_body_wins() -> None:
    params = header_parameters("int8", "1")
    assert params == {"fallback": "int8", "priority": 1}
    assert header_parameters("none", None) == {"fallback": "none"}
    assert header_parameters(None, None) == {}
    body = json.dumps({"inputs": [], "parameters": {"priority": 2}}).encode()
    out, length = add_parameters(body, None, params)
    assert length is None
    assert json.loads(out)["parameters"] == {"priority": 2, "fallback": "int8"}


def test_binary_request_keeps_its_tensors() -> None:
    header = json.dumps({"inputs": []}).encode()
    out, length = add_parameters(header + b"\x01\x02", str(len(header)), {"fallback": "none"})
    assert length is not None and out[int(length) :] == b"\x01\x02"
    assert json.loads(out[: int(length)])["parameters"] == {"fallback": "none"}


@pytest.mark.parametrize(
    ("fallback", "priority", "named"),
    [
        ("", None, "X-Fallback"),
        ("int8; drop", None, "X-Fallback"),
        (None, "0", "X-Priority"),
        (None, "high", "X-Priority"),
    ],
)
def test_bad_header_values_are_400_naming_the_header(
    fallback: str | None, priority: str | None, named: str
) -> None:
    with pytest.raises(FrontError, match=named) as err:
        header_parameters(fallback, priority)
    assert err.value.status == 400


def test_variant_is_read_from_json_and_binary_answers() -> None:
    as_json = {
        "outputs": [{"name": "embedding", "data": [0.5]}, {"name": "variant", "data": ["int8"]}]
    }
    assert answered_variant(json.dumps(as_json).encode(), None) == "int8"
    emb = b"\x00" * 8
    var = struct.pack("<I", 4) + b"fp32"
    header = json.dumps(
        {
            "outputs": [
                {"name": "embedding", "parameters": {"binary_data_size": len(emb)}},
                {"name": "variant", "parameters": {"binary_data_size": len(var)}},
            ]
        }
    ).encode()
    assert answered_variant(header + emb + var, str(len(header))) == "fp32"
    # not a BLS answer, or garbage: no header rather than an error
    assert answered_variant(json.dumps({"outputs": [{"name": "embedding"}]}).encode(), None) is None
    assert answered_variant(b'{"variant"', None) is None
    assert answered_variant(b"{}", "x") is None
