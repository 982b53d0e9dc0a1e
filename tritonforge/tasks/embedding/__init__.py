"""The embedding task: texts -> one vector each (mean-pooled, normalized encoder output)."""

from tritonforge.tasks import PIPELINE, POOLED, Task

NAME = "embedding"
TASK = Task(
    NAME,
    __name__,
    kind=PIPELINE,
    encoder_output=POOLED,
    client_call="embed",
    openai_embeddings=True,
)
