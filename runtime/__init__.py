"""The embedded runtime: a real Triton Inference Server 2.51 (from the ``nvidia-pytriton`` wheel) on
CPU, without Docker, plus Python-based ``onnxruntime``/``pytorch`` backends so that the same
``config.pbtxt`` runs here and in the NVIDIA container."""

from tritonforge.runtime.errors import (
    EmbeddedServerError,
    ModelLoadError,
    ServerNotFoundError,
    ServerStartError,
)
from tritonforge.runtime.launcher.server import EmbeddedServer, ServerSettings

__all__ = [
    "EmbeddedServer",
    "EmbeddedServerError",
    "ModelLoadError",
    "ServerNotFoundError",
    "ServerSettings",
    "ServerStartError",
]
