"""Task folders: one folder per task (``tritonforge/tasks/<task>/``), each module named by its layer
(``stages``, ``export``, ``client``, ``routes``, ``loadtest``; anything else is core). See
docs/architecture.md, "Layers"."""
