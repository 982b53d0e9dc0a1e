"""The deploy package's exception base: every deploy error is a :class:`DeployError`, under the
project's root :class:`~tritonforge.errors.TritonforgeError`; its message says what to do.

The leaves live with the code that raises them: ``VendorError`` (vendor_schemas), ``GateError``
(gate), ``DeployCheckError`` (validate.documents), ``GpuCheckError`` and its two leaves (gpu_check).
"""

from __future__ import annotations

from tritonforge.errors import TritonforgeError


class DeployError(TritonforgeError):
    """Base of every error the deploy tools raise (validation, gates, GPU checks, vendoring)."""
