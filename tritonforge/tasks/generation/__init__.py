"""The generation task: a decoupled ``generate`` model per variant (SmolLM2 by default).

Its export (``export/``: the decoder's graph, verification and configs) fingerprints its own code
(``export.steps.CODE``, which starts with :data:`EXPORT_SOURCES`).
"""

from tritonforge.tasks import GENERATOR, Task

NAME = "generation"
EXPORT_SOURCES = ("tasks/generation", "export/specs/smollm2.py")
TASK = Task(
    NAME,
    __name__,
    kind=GENERATOR,
    stages={"generate": "generate_model.py"},
    export_sources=EXPORT_SOURCES,
)
