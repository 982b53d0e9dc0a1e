"""NVIDIA perf_analyzer: the binary (:mod:`.tool`) and its input data (:mod:`.inputs`)."""
