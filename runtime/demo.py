"""``make run``: show every served pipeline answering, discovered from the server's configs.

For each embedding pipeline: a few sentences through its fp32 ensemble over HTTP and its BLS over
gRPC (both orchestrations agree), their similarities, and every other variant the BLS serves. For
each classification pipeline: the same client's typed ``classify`` over HTTP (ensemble) and gRPC
(BLS): label, score and top-k per sentence. Nothing here names a model: the typed client
(:mod:`client.discovery`) reads names, variants, dims and labels from the configs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence

import numpy as np

from tritonforge.client.sync import EmbeddingClient
from tritonforge.env import env_float
from tritonforge.pipelines import Pipeline
from tritonforge.runtime.server import EmbeddedServer
from tritonforge.text import cosine_matrix, nearest_neighbours

SENTENCES = (
    "A man is playing a guitar.",
    "Someone strums an acoustic guitar on stage.",
    "The stock market fell sharply this morning.",
    "Shares dropped at the opening bell.",
    "A cat sleeps on the warm windowsill.",
    "A kitten naps in the afternoon sun.",
)
CLASSIFY_SENTENCES = (
    "I love how fast and friendly the support team was.",
    "The package arrived on Tuesday.",
    "This is the worst update they have ever shipped.",
)
TIMEOUT_S = env_float("TRITONFORGE_DEMO_TIMEOUT_S", 60.0)


def demo_client(
    server: EmbeddedServer, protocol: str, pipeline: str = "ensemble"
) -> EmbeddingClient:
    """A typed client for ``server`` that may read its configs (the admin key) to discover."""
    url = server.http_url if protocol == "http" else server.grpc_url
    return EmbeddingClient(
        url, protocol, pipeline=pipeline, timeout_s=TIMEOUT_S, admin_key=server.settings.admin_key
    )


def format_table(labels: Sequence[str], sim: np.ndarray) -> str:
    """A small pairwise-cosine table with numbered rows/columns."""
    head = "      " + "".join(f"{j:>7}" for j in range(len(labels)))
    rows = [f"  [{i}] " + "".join(f"{v:7.3f}" for v in sim[i]) for i in range(len(labels))]
    return "\n".join([head, *rows])


GENERATE_PROMPT = "In one sentence, what is an inference server?"
GENERATE_MODEL = "generate"


def stream_answer(server: EmbeddedServer, prompt: str = GENERATE_PROMPT) -> str:
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


def show_embeddings(server: EmbeddedServer, pipeline: Pipeline) -> None:
    """Embed :data:`SENTENCES` via the fp32 ensemble (HTTP) and the BLS (gRPC); similarities."""
    texts = list(SENTENCES)
    with demo_client(server, "http") as c:
        ensemble = c.embed(texts, variant="fp32", name=pipeline.name)
    print(
        f"\n==> {pipeline.name}: embedded {len(texts)} sentences through "
        f"{pipeline.model('fp32')!r} (HTTP): shape {list(ensemble.shape)}, unit L2 norm"
    )
    for i, text in enumerate(texts):
        print(f"  [{i}] {text}")
    sim = cosine_matrix(ensemble)
    print(f"\n==> pairwise cosine similarity ({pipeline.model('fp32')} over HTTP)")
    print(format_table(texts, sim))
    print("\n==> nearest neighbour of each sentence")
    for i, (j,) in enumerate(nearest_neighbours(sim, k=1)):
        print(f"  {texts[i]!r:48} -> {texts[j]!r} ({sim[i, j]:.3f})")
    if pipeline.bls is None:
        return
    with demo_client(server, "grpc", "bls") as c:
        by_variant = {
            v: c.embed(texts, variant=v, name=pipeline.name) for v in pipeline.bls_variants
        }
    agree = float(np.abs(ensemble - by_variant.get("fp32", ensemble)).max())
    others = "; ".join(
        f"{v} mean cosine to fp32 = {float((ensemble * e).sum(axis=1).mean()):.4f}"
        for v, e in by_variant.items()
        if v != "fp32"
    )
    print(f"\n==> {pipeline.bls} over gRPC: max |ensemble - BLS| = {agree:.2e}; {others}\n")


def show_classification(server: EmbeddedServer, pipeline: Pipeline) -> None:
    """Classify :data:`CLASSIFY_SENTENCES` via the ensemble (HTTP) and the BLS (gRPC)."""
    texts = list(CLASSIFY_SENTENCES)
    k = min(2, len(pipeline.labels))
    with demo_client(server, "http") as c:
        results = c.classify(texts, top_k=k, name=pipeline.name)
    print(
        f"\n==> {pipeline.name}: classified {len(texts)} sentences through "
        f"{pipeline.model('fp32')!r} (HTTP), labels {list(pipeline.labels)}"
    )
    for text, r in zip(texts, results, strict=True):
        top = ", ".join(f"{t.label} {t.score:.3f}" for t in r.top)
        print(f"  {text!r:56} -> {r.label} ({r.score:.3f}); top {k}: {top}")
    if pipeline.bls is None:
        return
    # Like with like: the ensemble answers with the latest version, so the BLS is pinned to it
    # (unpinned, the BLS would split traffic between the versions: shown separately below).
    pinned = pipeline.latest_version
    with demo_client(server, "grpc", "bls") as c:
        bls = c.classify(texts, top_k=k, name=pipeline.name, version=pinned)
    gap = max(
        abs(a.probabilities[label] - b.probabilities[label])
        for a, b in zip(results, bls, strict=True)
        for label in pipeline.labels
    )
    same = sum(a.label == b.label for a, b in zip(results, bls, strict=True))
    both = "" if pinned is None else f", both at version {pinned}"
    print(
        f"==> {pipeline.bls} over gRPC{both}: {same}/{len(texts)} labels agree, "
        f"max |ensemble - BLS| probability = {gap:.2e}"
    )
    if pipeline.version_weights:
        show_canary_split(server, pipeline)
    print()


CANARY_REQUESTS = 20


def format_split(answered: Sequence[str | None], weights: Mapping[int, int]) -> str:
    """``"v1 16/20 (80%), v2 4/20 (20%)"``: which version answered each unpinned request,
    next to the configured split."""
    counts = Counter(str(v) for v in answered)
    n = len(answered)
    return ", ".join(
        f"v{v} {counts.get(str(v), 0)}/{n} (configured {p}%)" for v, p in sorted(weights.items())
    )


def show_canary_split(server: EmbeddedServer, pipeline: Pipeline) -> None:
    """:data:`CANARY_REQUESTS` unpinned one-text requests through the BLS: which version
    answered each (the canary split by request), against the configured weights."""
    texts = [
        f"{CLASSIFY_SENTENCES[i % len(CLASSIFY_SENTENCES)]} (#{i})" for i in range(CANARY_REQUESTS)
    ]
    with demo_client(server, "grpc", "bls") as c:
        answered = [c.classify([t], name=pipeline.name)[0].model_version for t in texts]
    print(
        f"==> {pipeline.bls} unpinned (canary split): "
        f"{format_split(answered, pipeline.version_weights)}"
    )


def run_demo(server: EmbeddedServer, only: Collection[str] | None = None) -> None:
    """Every discovered pipeline answering (embeddings, then classifiers), then generation;
    with ``only``, just the pipelines (and the generation model) named there."""
    if only is not None and not only:
        return
    found = {}
    if only is None or set(only) - {GENERATE_MODEL}:
        with demo_client(server, "http") as c:
            found = c.pipelines()
    chosen = [p for p in found.values() if only is None or p.name in only]
    for pipeline in chosen:
        if pipeline.task == "embedding":
            show_embeddings(server, pipeline)
    for pipeline in chosen:
        if pipeline.task == "classification":
            show_classification(server, pipeline)
    if only is None or GENERATE_MODEL in only:
        stream_answer(server)
