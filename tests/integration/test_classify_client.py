"""``classify`` through the typed client against the real embedded Triton serving the tiny RoBERTa
classifier (``sentiment``, exported with the DistilBERT embedder ``distil`` into one temporary
repository: conftest.py). HTTP and gRPC, sync and async, ensemble and BLS; the pipeline's names,
labels and limits are discovered from the server's configs; bad input fails at once, naming the
field."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests import tiny_checkpoints
from tests.conftest import PROJECT_ROOT
from tritonforge.client import (
    AsyncEmbeddingClient,
    Classification,
    DiscoveryError,
    EmbeddingClient,
    InvalidRequestError,
    ModelNotFoundError,
)
from tritonforge.runtime.serving import EmbeddedServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TEXTS = ["The service answered every request in time.", "bad", "I really did not like it!"]
LABELS = tiny_checkpoints.LABELS


def url(server: EmbeddedServer, protocol: str) -> str:
    return server.http_url if protocol == "http" else server.grpc_url


def client(server: EmbeddedServer, protocol: str, **kw: object) -> EmbeddingClient:
    return EmbeddingClient(
        url(server, protocol), protocol, admin_key=server.settings.admin_key, **kw
    )  # type: ignore[arg-type]


def probabilities(results: list[Classification]) -> np.ndarray:
    return np.array([[r.probabilities[label] for label in LABELS] for r in results])


def test_pipelines_are_discovered_from_the_server(byo_server: EmbeddedServer) -> None:
    for protocol in ("http", "grpc"):
        with client(byo_server, protocol) as c:
            found = c.pipelines()
        assert sorted(found) == ["distil", "sentiment"], protocol
        sentiment = found["sentiment"]
        assert sentiment.task == "classification" and sentiment.labels == LABELS
        assert sentiment.output("probabilities").dims == (len(LABELS),)
        assert found["distil"].dim == 32  # the embedder's dim, as its config says


def test_without_the_admin_key_discovery_says_what_to_set(
    byo_server: EmbeddedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no ./model_repository to fall back to
    monkeypatch.delenv("TRITONFORGE_ADMIN_KEY", raising=False)
    monkeypatch.delenv("TRITONFORGE_MODEL_REPOSITORY", raising=False)
    with EmbeddingClient(byo_server.http_url, "http") as c, pytest.raises(DiscoveryError) as err:
        c.classify(TEXTS)
    assert "TRITONFORGE_ADMIN_KEY" in str(err.value)


def test_offline_discovery_from_the_repository(
    byo_server: EmbeddedServer, byo_repository: Path
) -> None:
    with EmbeddingClient(byo_server.grpc_url, "grpc", repository=str(byo_repository)) as c:
        [result] = c.classify("bad")
    assert result.label in LABELS


def test_classify_is_the_same_over_http_grpc_sync_async_ensemble_and_bls(
    byo_server: EmbeddedServer,
) -> None:
    results: dict[str, list[Classification]] = {}
    for protocol in ("http", "grpc"):
        for orchestration in ("ensemble", "bls"):
            with client(byo_server, protocol, pipeline=orchestration) as c:
                results[f"{protocol} {orchestration} sync"] = c.classify(TEXTS, top_k=2)

            async def run(protocol: str = protocol, orchestration: str = orchestration) -> list:
                async with AsyncEmbeddingClient(
                    url(byo_server, protocol),
                    protocol,
                    pipeline=orchestration,
                    admin_key=byo_server.settings.admin_key,
                ) as c:
                    return await c.classify(TEXTS, top_k=2)

            results[f"{protocol} {orchestration} async"] = asyncio.run(run())
    reference = results["http ensemble sync"]
    assert len(reference) == len(TEXTS)
    ref = probabilities(reference)
    np.testing.assert_allclose(ref.sum(axis=1), 1.0, atol=1e-5)
    for key, got in results.items():
        np.testing.assert_allclose(probabilities(got), ref, atol=1e-5, err_msg=key)
        for r, expected in zip(got, ref, strict=True):
            assert r.label == LABELS[int(expected.argmax())], key
            assert r.score == pytest.approx(float(expected.max()), abs=1e-5)
            assert [t.label for t in r.top] == [LABELS[i] for i in np.argsort(-expected)[:2]]
            assert r.top[0].score >= r.top[1].score
            assert r.model_version is None  # the pipeline does not say (yet)


def test_top_k_beyond_the_ensembles_default_is_ranked_from_the_probabilities(
    byo_server: EmbeddedServer,
) -> None:
    with client(byo_server, "grpc") as c:
        bls = c.classify(TEXTS, top_k=1, pipeline="bls")
        full = c.classify(TEXTS, top_k=len(LABELS), pipeline="ensemble")
    assert all(len(r.top) == 1 for r in bls)
    for r in full:
        assert sorted(t.label for t in r.top) == sorted(LABELS)
        assert [t.score for t in r.top] == sorted(r.probabilities.values(), reverse=True)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_input_fails_at_once_naming_the_field(
    byo_server: EmbeddedServer, protocol: str
) -> None:
    with client(byo_server, protocol, max_attempts=5) as c:
        limit = c.pipelines()["sentiment"].max_items
        cases = {
            "top_k": lambda: c.classify(TEXTS, top_k=len(LABELS) + 1),
            "top_k=0": lambda: c.classify(TEXTS, top_k=0),
            "max_items": lambda: c.classify(["x"] * (limit + 1)),
            "variant='int8'": lambda: c.classify(TEXTS, variant="int8"),  # not exported
            "name='nope'": lambda: c.classify(TEXTS, name="nope"),
            "embedding pipeline": lambda: c.classify(TEXTS, name="distil"),
            "texts is empty": lambda: c.classify([]),
        }
        for field, call in cases.items():
            with pytest.raises(InvalidRequestError, match=field.split("=")[0]) as err:
                call()
            assert err.value.attempts == 1, field
        with pytest.raises(ModelNotFoundError):
            c.classify(TEXTS, name="nope")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_servers_refusal_maps_to_the_same_error(
    byo_server: EmbeddedServer, protocol: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the client-side check, the BLS itself refuses top_k (INVALID_ARG / 400)."""
    from tritonforge.tasks.classification import client as classification

    monkeypatch.setattr(classification, "checked_top_k", lambda top_k, pipeline: top_k)
    with (
        client(byo_server, protocol, pipeline="bls", max_attempts=5) as c,
        pytest.raises(InvalidRequestError, match="top_k") as err,
    ):
        c.classify(TEXTS, top_k=len(LABELS) + 5)
    assert err.value.attempts == 1


def test_version_is_passed_through(byo_server: EmbeddedServer) -> None:
    with client(byo_server, "http") as c:
        [pinned] = c.classify("bad", version=1)  # the ensemble: standard model_version
        assert pinned.label in LABELS
        with pytest.raises(InvalidRequestError, match="version 7"):
            c.classify("bad", version=7)


def test_cli_classify_prints_typed_results(byo_server: EmbeddedServer) -> None:
    import os

    env = {**os.environ, "TRITONFORGE_ADMIN_KEY": byo_server.settings.admin_key}
    proc = subprocess.run(
        [sys.executable, "-m", "tritonforge.client", "classify", *TEXTS[:2], "--url",
         byo_server.grpc_url, "--protocol", "grpc", "--pipeline", "bls", "--top-k", "3"],
        capture_output=True, text=True, cwd=PROJECT_ROOT, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["name"] == "sentiment" and out["model"] == "sentiment_bls"
    assert [r["text"] for r in out["results"]] == TEXTS[:2]
    assert all(len(r["top"]) == 3 and r["label"] in LABELS for r in out["results"])
    bad = subprocess.run(
        [sys.executable, "-m", "tritonforge.client", "classify", "x", "--url",
         byo_server.http_url, "--top-k", "9"],
        capture_output=True, text=True, cwd=PROJECT_ROOT, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert bad.returncode == 1 and "top_k" in bad.stderr


def test_the_demo_shows_every_discovered_pipeline(
    byo_server: EmbeddedServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tritonforge.runtime.cli import demo

    monkeypatch.setattr(demo, "stream_answer", lambda server: "")  # no decoder in this repository
    demo.run_demo(byo_server)
    out = capsys.readouterr().out
    assert "==> distil: embedded" in out and "distil_bls over gRPC" in out
    assert "==> sentiment: classified 3 sentences" in out
    assert "sentiment_bls over gRPC: 3/3 labels agree" in out
