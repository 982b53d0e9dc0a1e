"""The embedding client against the real embedded Triton serving the real model repository."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import PROJECT_ROOT
from tritonforge.client import (
    AsyncEmbeddingClient,
    ConnectionFailedError,
    EmbeddingClient,
    InvalidRequestError,
)
from tritonforge.runtime.launcher.settings import free_port
from tritonforge.runtime.serving import EmbeddedServer

pytestmark = pytest.mark.integration

TEXTS = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "Stock markets fell sharply after the announcement of new tariffs on imported steel.",
]


def urls(server: EmbeddedServer) -> dict[str, str]:
    return {"http": server.http_url, "grpc": server.grpc_url}


def test_embed_is_the_same_over_http_grpc_sync_and_async(pipeline_server: EmbeddedServer) -> None:
    results = {}
    for protocol, url in urls(pipeline_server).items():
        with EmbeddingClient(url, protocol) as c:
            results[f"{protocol} sync"] = c.embed(TEXTS)

        async def run(protocol: str = protocol, url: str = url) -> np.ndarray:
            async with AsyncEmbeddingClient(url, protocol) as c:
                return await c.embed(TEXTS)

        results[f"{protocol} async"] = asyncio.run(run())
    reference = results["http sync"]
    assert reference.shape == (len(TEXTS), 384) and reference.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(reference, axis=1), 1.0, atol=1e-5)
    for name, vectors in results.items():
        np.testing.assert_allclose(vectors, reference, atol=1e-6, err_msg=name)
    # real semantics: the two "eating" sentences are closer to each other than to the others
    sims = reference @ reference.T
    assert sims[0, 1] > sims[0, 2] and sims[0, 1] > sims[0, 3]


def test_bls_matches_the_ensemble_and_batches_split_by_batch_size(
    pipeline_server: EmbeddedServer,
) -> None:
    with EmbeddingClient(pipeline_server.grpc_url, "grpc", batch_size=3) as c:
        ensemble = c.embed(TEXTS, variant="fp32", route="ensemble")
        bls = c.embed(TEXTS, variant="fp32", pipeline="bls")  # route's old name still works
    assert ensemble.shape == (4, 384)
    np.testing.assert_allclose(bls, ensemble, atol=1e-5)


def test_health_and_metadata(pipeline_server: EmbeddedServer) -> None:
    for protocol, url in urls(pipeline_server).items():
        with EmbeddingClient(url, protocol) as c:
            assert c.is_live() and c.is_ready()
            assert c.is_model_ready(variant="int8", route="ensemble")
            meta = c.metadata(route="bls")
            assert meta["name"] == "embed_bls"
            assert [i["name"] for i in meta["inputs"]] == ["text"]
            # the BLS also says which variant answered (docs/reliability.md, degradation)
            assert [o["name"] for o in meta["outputs"]] == ["embedding", "variant"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_invalid_request_fails_at_once_without_retries(
    pipeline_server: EmbeddedServer, protocol: str
) -> None:
    url = urls(pipeline_server)[protocol]
    with (
        EmbeddingClient(url, protocol, max_attempts=5) as c,
        pytest.raises(InvalidRequestError) as info,
    ):
        c.embed(["fine", "   "])  # whitespace-only text: the tokenizer answers INVALID_ARG
    assert info.value.attempts == 1
    assert "'embed'" in str(info.value) and "timeout" in str(info.value)
    assert info.value.__cause__ is not None


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_connection_refused_is_retried_until_the_deadline(protocol: str) -> None:
    from tritonforge.client.breaker import BreakerPolicy, CircuitBreaker

    url = f"127.0.0.1:{free_port()}"  # nothing listens there
    off = CircuitBreaker(url, BreakerPolicy(0))  # the deadline alone (the breaker: below)
    with (
        EmbeddingClient(url, protocol, max_attempts=1000, deadline_s=1.0, breaker=off) as c,
        pytest.raises(ConnectionFailedError) as info,
    ):
        c.embed(["hello"])
    assert info.value.attempts > 1
    assert "deadline 1 s" in str(info.value)
    # with the default breaker the retries stop when it opens (no retry storm), before that
    with (
        EmbeddingClient(url, protocol, max_attempts=1000, deadline_s=30.0) as c,
        pytest.raises(ConnectionFailedError, match=r"circuit for .* opened") as info,
    ):
        c.embed(["hello"])
    assert info.value.attempts == c.breaker.policy.failure_threshold


def test_async_connection_refused_is_retried_until_the_deadline() -> None:
    async def run() -> None:
        async with AsyncEmbeddingClient(
            f"127.0.0.1:{free_port()}", "http", max_attempts=1000, deadline_s=1.0
        ) as c:
            assert not await c.is_live()
            await c.embed(["hello"])

    with pytest.raises(ConnectionFailedError) as info:
        asyncio.run(run())
    assert info.value.attempts > 1


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tritonforge.client", *args],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        timeout=120,
        check=False,
    )


def test_cli_embed_and_similarity(pipeline_server: EmbeddedServer) -> None:
    done = _cli(
        "embed",
        "hello world",
        "second text",
        "--protocol",
        "grpc",
        "--url",
        pipeline_server.grpc_url,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["model"] == "embed" and out["dim"] == 384
    assert len(out["embeddings"]) == 2 and len(out["embeddings"][0]) == 384
    assert out["norms"] == pytest.approx([1.0, 1.0], abs=1e-4)
    with EmbeddingClient(pipeline_server.http_url, "http") as c:
        direct = c.embed(["hello world"])[0]
    np.testing.assert_allclose(out["embeddings"][0], direct, atol=1e-5)

    close = _cli(
        "similarity",
        "A man is eating food.",
        "A man is eating a piece of bread.",
        "--url",
        pipeline_server.http_url,
        "--route",
        "bls",
    )
    far = _cli(
        "similarity",
        "A man is eating food.",
        "Stock markets fell sharply.",
        "--url",
        pipeline_server.http_url,
    )
    assert close.returncode == 0 and far.returncode == 0, close.stderr + far.stderr
    assert json.loads(close.stdout)["cosine"] > json.loads(far.stdout)["cosine"] + 0.3


def test_cli_reports_errors_with_exit_status_1() -> None:
    done = _cli("embed", "x", "--url", f"127.0.0.1:{free_port()}", "--deadline-s", "0.5")
    assert done.returncode == 1
    assert "ConnectionFailedError" in done.stderr


def test_cli_health_exit_status_follows_readiness(pipeline_server: EmbeddedServer) -> None:
    up = _cli("health", "--url", pipeline_server.grpc_url, "--protocol", "grpc")
    assert up.returncode == 0, up.stderr
    report = json.loads(up.stdout)
    assert report["live"] and report["ready"] and report["metadata"]["name"] == "embed"
    down = _cli("health", "--url", f"127.0.0.1:{free_port()}")
    assert down.returncode == 1 and json.loads(down.stdout)["ready"] is False
