"""The shared Python-backend models' sources, one file per stage kind (a task's own stages
live in its folder, ``tritonforge/tasks/<task>/stages/``).

``make export`` copies each into ``<model>/1/model.py`` of every pipeline that has that stage
(:mod:`export.pipeline_configs`), so several pipelines share one tested source and a user's
repository needs nothing from a checkout. They run only inside Triton's Python stub: each imports
``triton_python_backend_utils`` first (see pyproject's isort sections) and is never imported here.
"""

SOURCES = {
    "tokenizer": "tokenizer_model.py",
    "bls": "bls_model.py",
    "fused": "fused_model.py",
}
