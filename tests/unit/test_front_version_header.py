"""runtime.front.body.apply_version_header: X-Model-Version -> the request parameter `version`."""

from __future__ import annotations

import json

import pytest

from tritonforge.runtime.errors import FrontError
from tritonforge.runtime.front.body import apply_version_header


def test_json_body_gets_the_parameter() -> None:
    body = json.dumps({"inputs": [{"name": "text", "shape": [1, 1]}]}).encode()
    out, length = apply_version_header(body, None, "2")
    assert length is None
    assert json.loads(out)["parameters"] == {"version": 2}


def test_binary_body_keeps_its_tensors_and_gets_a_new_header_length() -> None:
    header = json.dumps({"inputs": [], "parameters": {"top_k": 1}}).encode()
    out, length = apply_version_header(header + b"\x00\x01raw", str(len(header)), "1")
    assert length is not None and out[int(length) :] == b"\x00\x01raw"
    assert json.loads(out[: int(length)])["parameters"] == {"top_k": 1, "version": 1}


def test_a_parameter_in_the_body_wins() -> None:
    body = json.dumps({"parameters": {"version": 1}}).encode()
    out, _ = apply_version_header(body, None, "2")
    assert json.loads(out)["parameters"]["version"] == 1


@pytest.mark.parametrize("value", ["0", "-1", "latest", ""])
def test_bad_header_values_are_400(value: str) -> None:
    with pytest.raises(FrontError, match="X-Model-Version") as err:
        apply_version_header(b"{}", None, value)
    assert err.value.status == 400


@pytest.mark.parametrize("value", ["²", "1" * 5000], ids=["superscript", "5000-digits"])
def test_hostile_header_values_are_400_not_500(value: str) -> None:
    """Issue #19 finding 6: ``'²'.isdigit()`` is true and ``int('²')`` raises ValueError."""
    with pytest.raises(FrontError, match="X-Model-Version") as err:
        apply_version_header(b"{}", None, value)
    assert err.value.status == 400 and len(str(err.value)) < 200


@pytest.mark.parametrize("length", ["²", "1" * 5000])
def test_hostile_header_lengths_are_400_not_500(length: str) -> None:
    with pytest.raises(FrontError, match="Inference-Header-Content-Length") as err:
        apply_version_header(b"{}", length, "1")
    assert err.value.status == 400
