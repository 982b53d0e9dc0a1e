"""``make run``: embed a few sentences through the served pipeline and show what they mean.

The ``embed`` ensemble is called over HTTP and the ``embed_bls`` orchestrator over gRPC (plain
tritonclient), so one run shows both protocols and both orchestrations agree.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tritonforge.env import env_float
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
TEXT_INPUT, OUTPUT = "text", "embedding"
TIMEOUT_S = env_float("TRITONFORGE_DEMO_TIMEOUT_S", 60.0)


def _batch(texts: Sequence[str]) -> np.ndarray:
    return np.array([t.encode("utf-8") for t in texts], dtype=np.object_).reshape(-1, 1)


def embed_http(url: str, model: str, texts: Sequence[str]) -> np.ndarray:
    """Embeddings of ``texts`` from ``model`` over HTTP (one batched request)."""
    import tritonclient.http as httpclient

    data = _batch(texts)
    with httpclient.InferenceServerClient(url, network_timeout=TIMEOUT_S) as client:
        tensor = httpclient.InferInput(TEXT_INPUT, list(data.shape), "BYTES")
        tensor.set_data_from_numpy(data)
        result = client.infer(model, [tensor], outputs=[httpclient.InferRequestedOutput(OUTPUT)])
    return np.asarray(result.as_numpy(OUTPUT))


def embed_grpc(
    url: str, model: str, texts: Sequence[str], variant: str | None = None
) -> np.ndarray:
    """Embeddings of ``texts`` from ``model`` over gRPC; ``variant`` goes as a request parameter."""
    import tritonclient.grpc as grpcclient

    data = _batch(texts)
    with grpcclient.InferenceServerClient(url) as client:
        tensor = grpcclient.InferInput(TEXT_INPUT, list(data.shape), "BYTES")
        tensor.set_data_from_numpy(data)
        result = client.infer(
            model,
            [tensor],
            outputs=[grpcclient.InferRequestedOutput(OUTPUT)],
            parameters={"variant": variant} if variant else None,
            client_timeout=TIMEOUT_S,
        )
    return np.asarray(result.as_numpy(OUTPUT))


def format_table(labels: Sequence[str], sim: np.ndarray) -> str:
    """A small pairwise-cosine table with numbered rows/columns."""
    head = "      " + "".join(f"{j:>7}" for j in range(len(labels)))
    rows = [f"  [{i}] " + "".join(f"{v:7.3f}" for v in sim[i]) for i in range(len(labels))]
    return "\n".join([head, *rows])


def run_demo(server: EmbeddedServer) -> None:
    """Embed :data:`SENTENCES` via ``embed`` (HTTP) and ``embed_bls`` (gRPC); print similarities."""
    texts = list(SENTENCES)
    ensemble = embed_http(server.http_url, "embed", texts)
    bls = embed_grpc(server.grpc_url, "embed_bls", texts)
    int8 = embed_grpc(server.grpc_url, "embed_bls", texts, variant="int8")
    print(f"\n==> embedded {len(texts)} sentences: shape {list(ensemble.shape)}, unit L2 norm")
    for i, text in enumerate(texts):
        print(f"  [{i}] {text}")
    sim = cosine_matrix(ensemble)
    print("\n==> pairwise cosine similarity (embed ensemble over HTTP)")
    print(format_table(texts, sim))
    print("\n==> nearest neighbour of each sentence")
    for i, (j,) in enumerate(nearest_neighbours(sim, k=1)):
        print(f"  {texts[i]!r:48} -> {texts[j]!r} ({sim[i, j]:.3f})")
    agree = float(np.abs(ensemble - bls).max())
    int8_cos = float((ensemble * int8).sum(axis=1).mean())
    print(
        f"\n==> embed_bls over gRPC: max |ensemble - BLS| = {agree:.2e}; "
        f"int8 variant mean cosine to fp32 = {int8_cos:.4f}\n"
    )
