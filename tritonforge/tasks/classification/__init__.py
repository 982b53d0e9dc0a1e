"""The classification task: texts -> label, score, probabilities and top-k classes.

Its encoder's logits go through its postprocess stage (``stages/postprocess_model.py``) or the
BLS (which calls :func:`tritonforge.classify.classify`); its labels travel in every public config.
"""

from tritonforge.tasks import LOGITS, PIPELINE, Task

NAME = "classification"
TASK = Task(
    NAME,
    __name__,
    kind=PIPELINE,
    summary_output="probabilities",
    labels=True,
    encoder_output=LOGITS,
    stages={"postprocess": "postprocess_model.py"},
    # tasks.classification.export.training trains the checkpoint, keyed on its own digest
    export_sources=("tasks/classification/export/training",),
    client_call="classify",
)
