"""The front's pure checks and the stricter input checks (the integration tests send the real
hostile bodies through the real server)."""

from __future__ import annotations

import gzip
import json
import re
import zlib

import pytest

from tests.integration.reliability import gzip_bomb
from tritonforge.errors import InvalidInputError
from tritonforge.runtime.cli.main import main as cli_main
from tritonforge.runtime.errors import FrontError
from tritonforge.runtime.front.body import (
    MAX_ELEMENTS,
    check_json_shapes,
    check_shape,
    inflate,
    json_depth,
)
from tritonforge.runtime.front.grpc import GRPC_RESTRICTED
from tritonforge.runtime.front.http import HTTP_RESTRICTED
from tritonforge.text import TextLimits, decode_texts


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        (b"", 0),
        (b'{"a": 1}', 1),
        (b'{"inputs": [{"shape": [1, 1], "data": ["[[[[", "}}"]}]}', 4),
        (b'"[[[[\\"[[["', 0),
        (b"[" * 100 + b"]" * 100, 100),
    ],
)
def test_json_depth_counts_structure_not_strings(text: bytes, depth: int) -> None:
    assert json_depth(text) == depth


def test_json_depth_of_a_million_levels_is_measured_without_recursion() -> None:
    assert json_depth(b"[" * 10**6 + b"]" * 10**6) == 10**6


def test_inflate_stops_at_the_limit_plus_one_byte() -> None:
    assert inflate(gzip.compress(b"x" * 1000), "gzip", 1000) == b"x" * 1000
    assert inflate(zlib.compress(b"y" * 10), "deflate", 10) == b"y" * 10
    with pytest.raises(FrontError) as info:
        inflate(gzip_bomb(1 << 30), "gzip", 2 << 20)
    assert info.value.status == 413
    with pytest.raises(FrontError) as info:
        inflate(b"not gzip", "gzip", 100)
    assert info.value.status == 400


def test_gzip_bomb_is_what_it_claims() -> None:
    bomb = gzip_bomb(8 << 20)
    assert zlib.decompress(bomb, 16 + zlib.MAX_WBITS) == bytes(8 << 20)
    assert len(gzip_bomb(1 << 30)) < 1.1e6


@pytest.mark.parametrize("dims", [[2**32, 1], [2**32 + 1, 1], [-1, 1], [2**16, 2**16]])
def test_shapes_that_overflow_32_bits_are_refused(dims: list[int]) -> None:
    with pytest.raises(FrontError):
        check_shape(dims, "input 'text'")
    body = json.dumps({"inputs": [{"name": "text", "shape": dims, "data": ["a"]}]}).encode()
    with pytest.raises(FrontError, match="'text'"):
        check_json_shapes(body)


def test_ordinary_shapes_pass() -> None:
    check_shape([64, 1], "x")
    check_shape([MAX_ELEMENTS], "x")
    check_json_shapes(b'{"inputs": [{"name": "t", "shape": [2, 1]}]}')


@pytest.mark.parametrize(
    "path",
    [
        "/v2/repository/index",
        "/v2/models/embed/config",
        "/v2/models/embed/versions/1/config",
        "/v2/models/stats",
        "/v2/models/embed/stats",
        "/v2/systemsharedmemory/status",
        "/v2/cudasharedmemory/region/x/register",
        "/v2/trace/setting",
        "/v2/models/embed/trace/setting",
        "/v2/logging",
    ],
)
def test_admin_http_paths_are_restricted(path: str) -> None:
    assert HTTP_RESTRICTED.search(path)


@pytest.mark.parametrize(
    "path", ["/v2/models/embed/infer", "/v2/health/ready", "/v2/models/embed", "/v2"]
)
def test_inference_health_and_metadata_stay_open(path: str) -> None:
    assert not HTTP_RESTRICTED.search(path)


def test_admin_grpc_methods_are_restricted() -> None:
    service = "/inference.GRPCInferenceService/"
    assert f"{service}RepositoryModelLoad" in GRPC_RESTRICTED
    assert f"{service}SystemSharedMemoryRegister" in GRPC_RESTRICTED
    assert f"{service}ModelInfer" not in GRPC_RESTRICTED


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("\x00", "control character U+0000"),
        ("a\x1bb", "control character U+001B"),
        ("\u200b", "no letter"),
        ("\u200b\u2060\ufeff", "no letter"),
    ],
)
def test_content_free_texts_are_refused(text: str, fragment: str) -> None:
    with pytest.raises(InvalidInputError, match=re.escape(fragment)):
        decode_texts([text.encode()], "text", TextLimits())


@pytest.mark.parametrize("text", ["line one\nline two\t!", "?", "42", "日本語", "🙂"])
def test_real_texts_pass(text: str) -> None:
    assert decode_texts([text.encode()], "text", TextLimits()) == [text]


def test_serve_defaults_to_explicit_model_control(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli_main(["serve", "--help"])
    assert "explicit (default" in capsys.readouterr().out
