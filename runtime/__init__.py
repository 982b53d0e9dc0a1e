"""The embedded runtime: a real Triton Inference Server 2.51 (from the ``nvidia-pytriton`` wheel) on
CPU, without Docker, plus Python-based ``onnxruntime``/``pytorch`` backends so that the same
``config.pbtxt`` runs here and in the NVIDIA container.

Subpackages: :mod:`.launcher` (the tritonserver process), :mod:`.front` (the public relays and
``/v1``), :mod:`.supervisor` (health and self-healing), :mod:`.tenants` (keys, limits, usage),
:mod:`.cli` (``serve``, ``demo``, ``lint``); :mod:`.serving` composes the launcher and the front."""
