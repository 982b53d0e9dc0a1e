"""Task folders: one package per task, each module named by its layer (docs/architecture.md)."""
