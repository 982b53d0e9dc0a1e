"""The front's degradation headers (pure functions; :mod:`runtime.front.app` calls them).

Request: ``X-Fallback: int8`` (may be answered by the cheaper variant at a peak) or
``X-Fallback: none`` (never), and ``X-Priority: N`` (Triton's priority level, 1 first) become the
request parameters ``fallback`` and ``priority``. Response: ``X-Tritonforge-Variant`` says which
encoder variant answered (the BLS's ``variant`` output), so a caller sees a degraded answer
without reading the tensors. A parameter already in the body wins over a header
(:func:`runtime.front.body.add_parameters` writes them).
"""

from __future__ import annotations

import json
import struct
from typing import Any

from tritonforge.runtime.errors import FrontError

FALLBACK_HEADER = "X-Fallback"
PRIORITY_HEADER = "X-Priority"
VARIANT_HEADER = "X-Tritonforge-Variant"
VARIANT_OUTPUT = "variant"  # the BLS's output (tritonforge.bls.VARIANT_OUTPUT)
_MAX_VALUE_CHARS = 40


def header_parameters(fallback: str | None, priority: str | None) -> dict[str, Any]:
    """The request parameters the headers ask for (checked: a bad value is a 400 naming it)."""
    params: dict[str, Any] = {}
    if fallback is not None:
        value = fallback.strip()
        if not value or len(value) > _MAX_VALUE_CHARS or not value.replace("_", "").isalnum():
            raise FrontError(
                f"{FALLBACK_HEADER} must be a variant name or 'none', got {fallback[:20]!r}", 400
            )
        params["fallback"] = value
    if priority is not None:
        if not priority.strip().isdigit() or int(priority) < 1:
            raise FrontError(
                f"{PRIORITY_HEADER} must be a priority level >= 1, got {priority[:20]!r}", 400
            )
        params["priority"] = int(priority)
    return params


def answered_variant(body: bytes, header_length: str | None) -> str | None:
    """The first ``variant`` of an inference response (JSON data or binary BYTES), or None."""
    try:
        split = int(header_length) if header_length is not None else len(body)
        if b'"variant"' not in body[:split]:
            return None  # not a BLS answer: skip parsing (embeddings are large)
        header = json.loads(body[:split])
        outputs = header.get("outputs") or []
        offset = split
        for out in outputs:
            size = int((out.get("parameters") or {}).get("binary_data_size", 0))
            if out.get("name") == VARIANT_OUTPUT:
                if "data" in out:
                    return str(out["data"][0]) if out["data"] else None
                (n,) = struct.unpack_from("<I", body, offset)
                return body[offset + 4 : offset + 4 + n].decode("utf-8")
            offset += size
    except (ValueError, TypeError, AttributeError, KeyError, IndexError, struct.error):
        return None
    return None
