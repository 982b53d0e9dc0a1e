"""A BLS request's parameters: which variant answers (``variant``), which it may degrade to
(``fallback``), which encoder version (``version``, else the canary split) and how many classes
(``top_k``). Each reader takes Triton's parameters JSON (or a mapping) and the load-time plan, and
raises :class:`InvalidInputError` naming the parameter and the accepted values."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from tritonforge.bls import BlsPlan, Postprocess
from tritonforge.classify import TOP_K_PARAMETER, check_top_k
from tritonforge.errors import InvalidInputError, StageUnavailableError, shown
from tritonforge.pipelines import VARIANT_PARAMETER

VERSION_PARAMETER = "version"
FALLBACK_PARAMETER = "fallback"
NO_FALLBACK = "none"


def request_parameters(parameters_json: str | Mapping[str, Any] | None) -> Mapping[str, Any]:
    """A request's parameters as a mapping (Triton hands the BLS a JSON string)."""
    params: Any = parameters_json or {}
    if isinstance(params, str):
        try:
            params = json.loads(params) if params.strip() else {}
        except ValueError as e:  # JSONDecodeError, or an integer past 4300 digits
            raise InvalidInputError(
                f"request parameters are not valid JSON: {shown(str(e))}"
            ) from e
    if not isinstance(params, Mapping):
        raise InvalidInputError(f"request parameters must be a JSON object, got {shown(params)}")
    return params


def canary_bucket(key: str) -> int:
    """A stable bucket in [0, 100) for ``key`` (sha256: the same on every host and run)."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") % 100


def request_version(
    parameters_json: str | Mapping[str, Any] | None, key: str, plan: BlsPlan
) -> int:
    """The encoder version for a request: the ``version`` request parameter when given (one of
    the plan's versions), else the canary split by ``key`` (the request id, or its texts), else
    -1 (Triton's latest)."""
    value = request_parameters(parameters_json).get(VERSION_PARAMETER)
    if value is not None:
        try:
            text = str(value).strip()
            version = int(text) if len(text) <= 12 else -2
        except (TypeError, ValueError):
            version = -2
        if isinstance(value, bool) or version not in plan.versions:
            raise InvalidInputError(
                f"request parameter {VERSION_PARAMETER!r}={shown(value)} is unknown; "
                f"use one of {list(plan.versions) or '(this pipeline has one version)'}"
            )
        return version
    if plan.weights:
        bucket, edge = canary_bucket(key), 0
        for version, percent in sorted(plan.weights.items()):
            edge += percent
            if bucket < edge:
                return version
    return max(plan.versions) if plan.versions else -1


def request_top_k(parameters_json: str | Mapping[str, Any] | None, post: Postprocess) -> int:
    """The ``top_k`` a request asks for (request parameter), else the postprocess default."""
    params = request_parameters(parameters_json)
    if TOP_K_PARAMETER not in params:
        return post.top_k
    return check_top_k(params[TOP_K_PARAMETER], len(post.labels))


def request_variant(parameters_json: str | Mapping[str, Any] | None, plan: BlsPlan) -> str:
    """The encoder variant a request asks for (request parameter ``variant``) or the default."""
    value = request_parameters(parameters_json).get(VARIANT_PARAMETER, plan.default_variant)
    if isinstance(value, str) and value in plan.missing:
        raise StageUnavailableError(f"variant {value!r}: {plan.missing[value]}")
    if not isinstance(value, str) or value not in plan.encoders:
        raise InvalidInputError(
            f"request parameter {VARIANT_PARAMETER!r}={shown(value)} is unknown; "
            f"use one of {sorted([*plan.encoders, *plan.missing])}"
        )
    return value


def request_fallback(
    parameters_json: str | Mapping[str, Any] | None, variant: str, plan: BlsPlan
) -> str | None:
    """The variant this request may be answered from when ``variant`` is overloaded, or None.

    Request parameter ``fallback``: a variant name (opt in, whatever the pipeline's setting) or
    ``"none"`` (forbid). Without it, the pipeline's ``degrade`` setting decides, and only for
    requests that did not pin a ``variant``.
    """
    params = request_parameters(parameters_json)
    value = params.get(FALLBACK_PARAMETER)
    if value is None:
        pinned = VARIANT_PARAMETER in params
        chosen = plan.degrade.to if plan.degrade.enabled and not pinned else None
    elif isinstance(value, str) and value.strip().lower() == NO_FALLBACK:
        return None
    elif isinstance(value, str) and value in plan.encoders:
        chosen = value
    elif isinstance(value, str) and value in plan.missing:
        raise StageUnavailableError(
            f"{FALLBACK_PARAMETER} variant {value!r}: {plan.missing[value]}"
        )
    else:
        echo = repr(value) if len(repr(value)) <= 40 else f"<{len(repr(value))} characters>"
        raise InvalidInputError(
            f"request parameter {FALLBACK_PARAMETER!r}={echo} is unknown; use "
            f"{NO_FALLBACK!r} or one of {sorted(plan.encoders)}"
        )
    return None if chosen == variant else chosen
