"""The embedding task's client side: ``embed_flow`` (the client's ``.embed(texts)``, see
:data:`METHODS`) and ``show`` (``make run``'s demo of an embedding pipeline)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tritonforge.pipelines import Pipeline
from tritonforge.tasks.embedding import NAME
from tritonforge.text import cosine_matrix, nearest_neighbours

if TYPE_CHECKING:
    from tritonforge.client.core import BaseClient, Flow
    from tritonforge.client.sync import EmbeddingClient

# (protocol, route) -> a typed client of the demo's server
OpenClient = Callable[..., "EmbeddingClient"]
Emit = Callable[[str], None]  # where the demo writes its lines (runtime.cli.demo: stdout)

SENTENCES = (
    "A man is playing a guitar.",
    "Someone strums an acoustic guitar on stage.",
    "The stock market fell sharply this morning.",
    "Shares dropped at the opening bell.",
    "A cat sleeps on the warm windowsill.",
    "A kitten naps in the afternoon sun.",
)


def format_table(labels: Sequence[str], sim: np.ndarray) -> str:
    """A small pairwise-cosine table with numbered rows/columns."""
    head = "      " + "".join(f"{j:>7}" for j in range(len(labels)))
    rows = [f"  [{i}] " + "".join(f"{v:7.3f}" for v in sim[i]) for i in range(len(labels))]
    return "\n".join([head, *rows])


def show(open_client: OpenClient, pipeline: Pipeline, emit: Emit) -> None:
    """Embed :data:`SENTENCES` via the fp32 ensemble (HTTP) and the BLS (gRPC); similarities."""
    texts = list(SENTENCES)
    with open_client("http") as c:
        ensemble = c.embed(texts, variant="fp32", name=pipeline.name)
    emit(
        f"\n==> {pipeline.name}: embedded {len(texts)} sentences through "
        f"{pipeline.model('fp32')!r} (HTTP): shape {list(ensemble.shape)}, unit L2 norm"
    )
    for i, text in enumerate(texts):
        emit(f"  [{i}] {text}")
    sim = cosine_matrix(ensemble)
    emit(f"\n==> pairwise cosine similarity ({pipeline.model('fp32')} over HTTP)")
    emit(format_table(texts, sim))
    emit("\n==> nearest neighbour of each sentence")
    for i, (j,) in enumerate(nearest_neighbours(sim, k=1)):
        emit(f"  {texts[i]!r:48} -> {texts[j]!r} ({sim[i, j]:.3f})")
    if pipeline.bls is None:
        return
    with open_client("grpc", "bls") as c:
        by_variant = {
            v: c.embed(texts, variant=v, name=pipeline.name) for v in pipeline.bls_variants
        }
    agree = float(np.abs(ensemble - by_variant.get("fp32", ensemble)).max())
    others = "; ".join(
        f"{v} mean cosine to fp32 = {float((ensemble * e).sum(axis=1).mean()):.4f}"
        for v, e in by_variant.items()
        if v != "fp32"
    )
    emit(f"\n==> {pipeline.bls} over gRPC: max |ensemble - BLS| = {agree:.2e}; {others}\n")


def embed_flow(
    client: BaseClient,
    texts: Sequence[str] | str,
    variant: str | None = None,
    route: str | None = None,
    traceparent: str | None = None,
    name: str | None = None,
    *,
    pipeline: str | None = None,
) -> Flow[np.ndarray]:
    """Embeddings of ``texts``: float32 [n, dim], one unit-norm row per text, in order.

    Texts are sent in requests of at most ``batch_size`` (and the pipeline's ``max_items``),
    each with a W3C ``traceparent`` (``traceparent``, else the active OpenTelemetry span's,
    else a fresh one; the last one sent is ``last_traceparent``). ``pipeline``: the old name
    of ``route``.
    """
    from tritonforge.client.wire import check_texts, chunks, decode, make_inputs, make_outputs

    items = check_texts(texts)
    resolved = yield from client.resolve_flow(NAME, name, route, variant, pipeline=pipeline)
    target, model, parameters = resolved
    outputs = make_outputs(client.tritonclient, [target.outputs[0].name])
    parts = []
    for chunk in chunks(items, min(client.settings.batch_size, target.max_items)):
        headers = client.trace(traceparent)
        inputs = make_inputs(client.tritonclient, chunk, target.input)
        result = yield client.infer_call(model, inputs, outputs, parameters, headers)
        parts.append(decode(result, target, len(chunk), client.context(model)))
    return np.concatenate(parts, axis=0)


# the client methods this task adds (client.core.install_task_methods)
METHODS: dict[str, Callable[..., Any]] = {"embed": embed_flow}
