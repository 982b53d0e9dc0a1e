"""The generation task's Triton Python models (copied into the repository by the export)."""
