"""What the front checks and rewrites in a request body before Triton parses it: tensor shapes
(Triton 2.51 truncates dims to 32 bits), JSON nesting (it parses JSON recursively), compressed
bodies (it inflates them without a bound) and the request parameters the headers ask for.

Pure functions; a refusal is a :class:`FrontError` naming what is wrong (400, or 413 past a size
bound).
"""

from __future__ import annotations

import itertools
import json
import re
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

from aiohttp import web
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from tritonforge.errors import shown
from tritonforge.runtime.errors import FrontError
from tritonforge.runtime.front.guard import (
    LENGTH_HEADER,
    VERSION_HEADER,
    VERSION_PARAMETER,
    parse_header_length,
    parse_version,
)

_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DEPTH_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
INFLATE_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
"""The ``Content-Encoding`` values the front inflates, with their zlib window bits."""
_JSON_SHAPE = re.compile(rb'"shape"\s*:\s*\[([^\]]*)\]')
MAX_ELEMENTS = 2**31 - 1
"""Triton 2.51 truncates dims to 32 bits: ``[2**32 + 1, 1]`` passes as batch 1 (and skips the
max_batch_size check). Every dim, and every tensor's element count, must fit."""


def check_shape(dims: Iterable[int], where: str) -> None:
    """Raise :class:`FrontError` (400) for a negative dim or more than ``MAX_ELEMENTS``."""
    count = 1
    for d in dims:
        if not 0 <= d <= MAX_ELEMENTS:
            raise FrontError(f"{where}: shape dim {d} is outside [0, {MAX_ELEMENTS}]", 400)
        count *= d
        if count > MAX_ELEMENTS:
            raise FrontError(f"{where}: shape has more than {MAX_ELEMENTS} elements", 400)


def check_json_shapes(json_part: bytes) -> None:
    """Shape checks on an HTTP inference header: a regex finds the shapes (fast path); only a bad
    one costs a JSON parse, to name its tensor (the depth is already bounded)."""
    for m in _JSON_SHAPE.finditer(json_part):
        try:
            dims = [int(d) for d in m.group(1).split(b",") if d.strip()]
            check_shape(dims, "input")
        except ValueError:
            continue  # not integers: Triton's own parser answers that
        except FrontError:
            for tensor in _json_tensors(json_part):
                check_shape(tensor.get("shape", []), f"input {shown(str(tensor.get('name')))}")
            raise


def _json_tensors(json_part: bytes) -> list[dict[str, Any]]:
    try:
        inputs = json.loads(json_part).get("inputs", [])
    except (ValueError, AttributeError):
        return []
    return [t for t in inputs if isinstance(t, dict) and isinstance(t.get("shape"), list)]


def check_infer_message(message: bytes) -> service_pb2.ModelInferRequest:
    """Shape checks on a serialized gRPC ``ModelInferRequest`` (parsed by upb: microseconds);
    returns the parsed request."""
    try:
        request = service_pb2.ModelInferRequest.FromString(message)
    except DecodeError as e:
        raise FrontError(f"not a valid ModelInferRequest ({shown(str(e))})", 400) from e
    for tensor in request.inputs:
        check_shape(tensor.shape, f"input {shown(tensor.name)}")
    return request


def json_depth(data: bytes) -> int:
    """Deepest ``[``/``{`` nesting of a JSON text (brackets inside strings do not count)."""
    brackets = _JSON_STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    return max(itertools.accumulate(_DEPTH_STEP[b] for b in brackets))


def inflate(data: bytes, encoding: str, limit_bytes: int) -> bytes:
    """Decompress a gzip/deflate body, never producing more than ``limit_bytes`` + 1 bytes.

    Raises :class:`FrontError` when the result would exceed ``limit_bytes`` or the data is corrupt.
    """
    try:
        inflater = zlib.decompressobj(INFLATE_WBITS[encoding])
        out = inflater.decompress(data, limit_bytes + 1)
    except zlib.error as e:
        raise FrontError(f"body is not valid {encoding} data ({e})", 400) from e
    if len(out) > limit_bytes or inflater.unconsumed_tail:
        raise FrontError(
            f"{encoding} body inflates past the {limit_bytes} byte limit (max_body_bytes)", 413
        )
    return out


def add_parameters(
    body: bytes, header_length: str | None, params: Mapping[str, Any]
) -> tuple[bytes, str | None]:
    """``body`` (JSON, or a JSON header of ``header_length`` bytes + binary tensors) with
    ``params`` added to its ``parameters`` where not already set (a parameter in the body wins);
    returns it and the new ``Inference-Header-Content-Length`` (None for a plain JSON body).
    Parsed defensively: :class:`FrontError` (400) naming what is wrong otherwise."""
    split = (
        parse_header_length(header_length, len(body), LENGTH_HEADER)
        if header_length is not None
        else len(body)
    )
    try:
        header = json.loads(body[:split] or b"{}")
    except ValueError as e:
        raise FrontError(f"the inference request is not valid JSON: {shown(str(e))}", 400) from e
    if not isinstance(header, dict):
        raise FrontError("the inference request must be a JSON object", 400)
    existing = header.setdefault("parameters", {})
    if not isinstance(existing, dict):
        raise FrontError("'parameters' must be a JSON object", 400)
    for key, value in params.items():
        existing.setdefault(key, value)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    return encoded + body[split:], (str(len(encoded)) if header_length is not None else None)


def apply_version_header(
    body: bytes, header_length: str | None, value: str
) -> tuple[bytes, str | None]:
    """An inference body with ``X-Model-Version: N`` turned into the request parameter
    ``version`` (what the BLS reads to pin a model version); returns the new body and
    ``Inference-Header-Content-Length``. A parameter already in the body wins. Every value is
    parsed defensively: :class:`FrontError` (400) naming the header otherwise."""
    version = parse_version(value, VERSION_HEADER)
    return add_parameters(body, header_length, {VERSION_PARAMETER: version})


def json_has_version(header_length: str | None, body: bytes) -> bool:
    """Whether an (already checked) inference header sets the ``version`` parameter."""
    part = body[: int(header_length)] if header_length is not None else body
    if b'"version"' not in part:
        return False
    try:
        params = json.loads(part).get("parameters")
    except (ValueError, AttributeError):
        return False
    return isinstance(params, dict) and VERSION_PARAMETER in params


async def read_body(request: web.BaseRequest, limit_bytes: int) -> bytes:
    """The body of ``request`` as sent; 413 (:class:`FrontError`) past ``limit_bytes``, from the
    ``Content-Length`` alone or while reading a chunked body (every relay reads bodies here)."""
    length = request.content_length
    if length is not None and length > limit_bytes:
        raise FrontError(f"body of {length} bytes exceeds max_body_bytes={limit_bytes}", 413)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit_bytes:
            raise FrontError(f"body exceeds max_body_bytes={limit_bytes}", 413)
        chunks.append(chunk)
    return b"".join(chunks)
