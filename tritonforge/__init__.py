"""Shared core of tritonforge: the model-config contract, request batching and the text pipeline.

Imported by the Triton models (inside the Python backend stub, embedded or in the NVIDIA
container), by the Python-based backends of ``runtime/`` and by the tests. It must only depend
on numpy (and, for :mod:`tritonforge.text`, on ``tokenizers``).
"""

__all__ = ["__version__"]
__version__ = "0.1.0"
