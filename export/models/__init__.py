"""Plain-torch model definitions the export specs build (no transformers dependency)."""
