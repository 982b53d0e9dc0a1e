"""``make run``: show every served pipeline answering, discovered from the server's configs.

Each pipeline is shown by its task's client (``show`` in ``tritonforge/tasks/<task>/client.py``):
an embedding pipeline's sentences through its fp32 ensemble over HTTP and its BLS over gRPC
(both orchestrations agree) and their similarities; a classifier's labels, scores and top-k.
Nothing here names a model: the typed client (:mod:`client.discovery`) reads names, variants,
dims and labels from the configs.
"""

from __future__ import annotations

from collections.abc import Collection
from functools import partial

from tritonforge import tasks
from tritonforge.client.sync import EmbeddingClient
from tritonforge.env import env_float
from tritonforge.errors import ModelConfigError
from tritonforge.pipelines import TASK_KEY, Pipeline
from tritonforge.repository import load_model_config
from tritonforge.runtime.launcher.server import TritonLauncher

TIMEOUT_S = env_float("TRITONFORGE_DEMO_TIMEOUT_S", 60.0)


def demo_client(
    server: TritonLauncher, protocol: str, pipeline: str = "ensemble"
) -> EmbeddingClient:
    """A typed client for ``server`` that may read its configs (the admin key) to discover."""
    url = server.http_url if protocol == "http" else server.grpc_url
    return EmbeddingClient(
        url, protocol, pipeline=pipeline, timeout_s=TIMEOUT_S, admin_key=server.settings.admin_key
    )


GENERATE_PROMPT = "In one sentence, what is an inference server?"
GENERATE_MODEL = "generate"


def stream_answer(server: TritonLauncher, prompt: str = GENERATE_PROMPT) -> str:
    """Stream a greedy answer from the ``generate`` model over gRPC, printing chunks as they
    arrive; returns the text."""
    from tritonforge.client.generate import GenerateClient

    print(f"==> {GENERATE_MODEL} (decoupled, gRPC stream): {prompt!r}\n    ", end="", flush=True)
    parts = []
    with GenerateClient(
        server.grpc_url, "grpc", model=GENERATE_MODEL, timeout_s=TIMEOUT_S
    ) as client:
        for chunk in client.generate(prompt, stream=True, max_tokens=48):
            parts.append(chunk)
            print(chunk, end="", flush=True)
    print(f"\n    [finish_reason: {client.last_finish_reason}]\n")
    return "".join(parts)


def show(server: TritonLauncher, pipeline: Pipeline) -> None:
    """``pipeline`` answering, as its task's client shows it (``tasks/<task>/client.py``)."""
    show_pipeline = tasks.get(pipeline.task).module("client").show
    show_pipeline(partial(demo_client, server), pipeline, print)


def served_tasks(server: TritonLauncher, names: Collection[str]) -> dict[str, str]:
    """The task of each model of ``names`` (its config's ``tritonforge.task``), so a unit named
    after its model (``efficientnet_lite0``) shows its task (``image``); unreadable ones skipped."""
    found = {}
    for name in names:
        try:
            config = load_model_config(server.settings.model_repository, name)
        except ModelConfigError:
            continue
        found[name] = config.param(TASK_KEY, "", str)
    return found


def run_demo(server: TritonLauncher, only: Collection[str] | None = None) -> None:
    """Every discovered pipeline answering (embeddings, then classifiers), then generation;
    with ``only``, just the pipelines (and the generation model) named there."""
    if only is not None and not only:
        return
    found = {}
    # tasks of their own kind (rerank): shown by their client's show, after the pipelines
    own = {
        t.name for t in tasks.registry().values() if t.kind not in (tasks.PIPELINE, tasks.GENERATOR)
    }
    named = {} if only is None else served_tasks(server, only)
    # the names of pipelines to discover (a unit of a task of its own kind needs none)
    rest = {n for n in only or () if n != GENERATE_MODEL and own.isdisjoint({n, named.get(n)})}
    if only is None or rest:
        with demo_client(server, "http") as c:
            found = c.pipelines()
    chosen = [p for p in found.values() if only is None or p.name in only]
    order = tasks.names(tasks.PIPELINE)  # the registry's order: embeddings, then classifiers
    for pipeline in sorted(chosen, key=lambda p: order.index(p.task)):
        show(server, pipeline)
    for task in tasks.registry().values():  # tasks of their own kind (rerank): their client's show
        if task.kind not in (tasks.PIPELINE, tasks.GENERATOR) and (
            only is None or task.name in only or task.name in named.values()
        ):
            task.module("client").show(partial(demo_client, server), None, print)
    if only is None or GENERATE_MODEL in only:
        stream_answer(server)
