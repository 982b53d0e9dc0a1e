"""Triton's answers while a model restarts are transient, whatever their status code."""

from __future__ import annotations

import pytest
from tritonclient.utils import InferenceServerException

from tritonforge.client.retry import translate


@pytest.mark.parametrize(
    ("message", "status"),
    [
        ("Request for unknown model: 'encoder_int8' has no available versions", "StatusCode.NOT_FOUND"),
        ("Request for unknown model: 'embed' has no available versions", "400"),
        ("Failed to process the request(s) for model 'encoder_fp32_0_0', message: Stub process "
         "'encoder_fp32_0_0' is not healthy.", "StatusCode.INTERNAL"),
        ("tritonserver not reachable (restarting?)", "StatusCode.UNAVAILABLE"),
    ],
)  # fmt: skip
def test_restart_errors_are_retried(message: str, status: str) -> None:
    error = translate(InferenceServerException(message, status=status), "embed")
    assert error.transient, error


@pytest.mark.parametrize(
    ("message", "status"),
    [
        ("Request for unknown model: 'nope' is not found", "StatusCode.NOT_FOUND"),
        ("this API is restricted: send the admin key", "StatusCode.PERMISSION_DENIED"),
        ("this API is restricted: send the admin key", "403"),
    ],
)
def test_caller_errors_are_not(message: str, status: str) -> None:
    assert not translate(InferenceServerException(message, status=status), "x").transient
