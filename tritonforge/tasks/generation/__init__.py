"""The generation task: a decoupled ``generate`` model per variant (SmolLM2 by default).

Its export (``export/decoder``) fingerprints its own code (``export.decoder.steps.CODE``, which
starts with :data:`EXPORT_SOURCES`).
"""

from tritonforge.tasks import GENERATOR, Task

NAME = "generation"
EXPORT_SOURCES = ("export/decoder", "export/specs/smollm2.py", "tasks/generation")
TASK = Task(
    NAME,
    __name__,
    kind=GENERATOR,
    stages={"generate": "generate_model.py"},
    export_sources=EXPORT_SOURCES,
)
