"""The generation task's benches (loadtest layer)."""
