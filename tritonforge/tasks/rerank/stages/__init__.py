"""The rerank task's Triton Python models (the export copies them into the repository)."""
