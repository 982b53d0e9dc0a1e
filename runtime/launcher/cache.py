"""Triton's local response cache (shipped in the wheel), as tritonserver arguments.

A model opts in with ``response_cache { enable: true }`` (generated for the ensembles of a
pipeline whose spec sets ``response_cache``); the server gives the cache its size. Entries are
keyed by model, version and the request's inputs, so a new model version never serves another
version's entries; the size bounds memory (least recently used entries are evicted). Hits and
misses show in the ``nv_cache_*`` metrics.
"""

from __future__ import annotations

from tritonforge.env import env_int
from tritonforge.runtime.launcher.locate import TritonInstall, find_triton

CACHE_ENV = "TRITONFORGE_CACHE_BYTES"
DEFAULT_CACHE_BYTES = 64 << 20


def cache_args(size_bytes: int | None = None, install: TritonInstall | None = None) -> list[str]:
    """``--cache-config local,size=N`` plus the wheel's cache directory (the default
    ``/opt/tritonserver/caches`` does not exist outside NVIDIA's container); ``[]`` for 0."""
    size = env_int(CACHE_ENV, DEFAULT_CACHE_BYTES) if size_bytes is None else size_bytes
    if size <= 0:
        return []
    install = install or find_triton()
    return [
        f"--cache-directory={install.root / 'caches'}",
        f"--cache-config=local,size={int(size)}",
    ]
