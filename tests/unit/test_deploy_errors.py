"""One exception base for the deploy package: every deploy error is a DeployError, under the
project's root, and none is a bare builtin (``except RuntimeError`` must not catch them)."""

from __future__ import annotations

import pytest

from tritonforge.deploy import gate, gpu_check, vendor_schemas
from tritonforge.deploy.errors import DeployError
from tritonforge.deploy.validate import documents
from tritonforge.errors import TritonforgeError

LEAVES = (
    vendor_schemas.VendorError,
    gate.GateError,
    documents.DeployCheckError,
    gpu_check.GpuCheckError,
    gpu_check.NoGpuProviderError,
    gpu_check.ModelMissingError,
)


@pytest.mark.parametrize("error", LEAVES, ids=lambda e: e.__name__)
def test_every_deploy_error_is_a_deploy_error(error: type[Exception]) -> None:
    assert issubclass(error, DeployError)
    assert issubclass(error, TritonforgeError)
    assert not issubclass(error, RuntimeError | ValueError)
