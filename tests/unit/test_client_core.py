"""The client core: one set of flows behind the blocking and the asyncio client.

A fake tritonclient transport stands in for the server (the real one is exercised by
tests/integration/test_client.py); it records every call so both shells are seen to send the
same requests, retry the same way and decode the same answers.
"""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from tests.fake_repository import write_model
from tests.unit.test_client_discovery import public, stage
from tritonforge import tasks
from tritonforge.client import AsyncEmbeddingClient, EmbeddingClient
from tritonforge.client.core import chosen_route
from tritonforge.client.discovery import ADMIN_KEY_ENV, REPOSITORY_ENV
from tritonforge.client.errors import (
    ClientError,
    ConnectionFailedError,
    DiscoveryError,
    InvalidRequestError,
)
from tritonforge.errors import TritonforgeError

CONFIGS = [
    stage("embed", "embedding", "tokenizer", "tokenizer"),
    public("embed", "embedding", "ensemble", "embed", "fp32"),
    public("embed", "embedding", "ensemble", "embed_int8", "int8"),
    public("embed", "embedding", "bls", "embed_bls", encoder_models="fp32=x,int8=y"),
]


class FakeResult:
    def __init__(self, rows: int) -> None:
        vectors = np.zeros((rows, 8), dtype=np.float32)
        vectors[:, 0] = 1.0
        self.arrays = {"embedding": vectors}

    def as_numpy(self, name: str) -> Any:
        return self.arrays.get(name)


class FakeTransport:
    """tritonclient.http's InferenceServerClient surface; ``fail`` transient errors first."""

    def __init__(self, fail: int = 0, live: bool | Exception = True) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.fail = fail
        self.live = live

    def _record(self, method: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((method, args, kwargs))
        if self.fail:
            self.fail -= 1
            raise InferenceServerException("overloaded", status="503")

    def get_model_repository_index(self, **kw: Any) -> Any:
        self._record("index", **kw)
        return [{"name": c["name"], "state": "READY"} for c in CONFIGS]

    def get_model_config(self, model: str, **kw: Any) -> Any:
        self._record("config", model, **kw)
        return next(c for c in CONFIGS if c["name"] == model)

    def infer(self, model: str, inputs: list[Any], **kw: Any) -> Any:
        self._record("infer", model, **kw)
        return FakeResult(inputs[0].shape()[0])

    def is_server_live(self, **kw: Any) -> bool:
        self._record("live", **kw)
        if isinstance(self.live, Exception):
            raise self.live
        return self.live

    def close(self) -> None:
        self.calls.append(("close", (), {}))


class AsyncFake:
    """The same transport with coroutine methods (tritonclient.http.aio's surface)."""

    def __init__(self, sync: FakeTransport) -> None:
        self.sync = sync

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.sync, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return method(*args, **kwargs)

        return call


def sync_client(transport: FakeTransport, **kw: Any) -> EmbeddingClient:
    c = EmbeddingClient("h:1", "http", batch_size=3, max_attempts=3, **kw)
    c._client = transport
    c.policy = type(c.policy)(max_attempts=3, initial_backoff_s=0.0, max_backoff_s=0.0)
    return c


def async_client(transport: FakeTransport, **kw: Any) -> AsyncEmbeddingClient:
    c = AsyncEmbeddingClient("h:1", "http", batch_size=3, max_attempts=3, **kw)
    c._client = AsyncFake(transport)
    c.policy = type(c.policy)(max_attempts=3, initial_backoff_s=0.0, max_backoff_s=0.0)
    return c


def test_sync_and_async_send_the_same_requests_and_decode_the_same_answers() -> None:
    texts = ["a", "b", "c", "d"]
    one, two = FakeTransport(fail=1), FakeTransport(fail=1)
    with sync_client(one) as c:
        vectors = c.embed(texts, route="bls")
        assert c.last_traceparent is not None

    async def main() -> np.ndarray:
        async with async_client(two) as a:
            return await a.embed(texts, pipeline="bls")  # the old name of route

    assert np.array_equal(vectors, asyncio.run(main()))
    assert vectors.shape == (4, 8)
    sent = [(m, a) for m, a, _ in one.calls if m != "close"]
    assert sent == [(m, a) for m, a, _ in two.calls if m != "close"]
    assert sent[:2] == [("index", ()), ("index", ())]  # the 503 was retried
    infers = [kw for m, _, kw in one.calls if m == "infer"]
    assert len(infers) == 2  # batch_size 3: two requests
    assert infers[0]["parameters"] == {"variant": "fp32"}
    assert next(a for m, a, _ in one.calls if m == "infer") == ("embed_bls",)


def test_probes_are_not_retried_and_a_refused_connection_reads_false() -> None:
    refused = ConnectionRefusedError("refused")
    transport = FakeTransport(live=refused)
    assert sync_client(transport).is_live() is False
    assert [m for m, _, _ in transport.calls] == ["live"]
    assert asyncio.run(async_client(FakeTransport()).is_live()) is True
    with pytest.raises(ClientError, match="unexpected"):
        sync_client(FakeTransport(live=KeyError("x"))).is_live()


def test_route_and_its_old_name_pipeline() -> None:
    assert chosen_route("bls", None) == chosen_route(None, "bls") == "bls"
    with pytest.raises(InvalidRequestError, match="route='bls' and pipeline='ensemble'"):
        chosen_route("bls", "ensemble")
    c = sync_client(FakeTransport(), pipeline="bls")
    assert c.settings.route == c.settings.pipeline == "bls"
    _, model, _ = c.resolve("embedding", None, None, None)
    assert model == "embed_bls"
    _, model, _ = c.resolve("embedding", None, None, None, pipeline="ensemble")
    assert model == "embed"
    params = inspect.signature(EmbeddingClient.classify).parameters
    # a task's flow (its client.py's METHODS) takes the client first
    assert list(params)[1:6] == ["texts", "top_k", "version", "variant", "route"]
    assert "pipeline" in params and inspect.iscoroutinefunction(AsyncEmbeddingClient.embed)


def test_client_errors_derive_from_the_project_root() -> None:
    assert issubclass(ClientError, TritonforgeError)
    assert issubclass(ConnectionFailedError, ClientError)


def test_a_client_belongs_to_its_thread() -> None:
    import threading

    c = sync_client(FakeTransport())
    errors: list[BaseException] = []

    def other() -> None:
        try:
            c.embed(["x"])
        except ClientError as e:
            errors.append(e)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert "create one client per thread" in str(errors[0])


def test_cli_route_flag_and_its_old_name(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from tritonforge.client import cli

    parser = argparse.ArgumentParser()
    cli._common(parser)
    assert parser.parse_args(["--route", "bls"]).route == "bls"
    assert parser.parse_args(["--pipeline", "bls"]).route == "bls"  # the old name
    monkeypatch.delenv("TRITONFORGE_PIPELINE", raising=False)
    args = parser.parse_args(["--url", "h:1", "--pipeline", "bls", "--timeout-s", "2"])
    c = cli.open_client(args)
    assert (c.settings.route, c.settings.address, c.settings.timeout_s) == ("bls", "h:1", 2.0)
    c.close()


def test_configs_skip_a_model_unloaded_since_the_index_was_read() -> None:
    transport = FakeTransport()
    gone = CONFIGS[1]["name"]
    real = transport.get_model_config

    def config(model: str, **kw: Any) -> Any:
        if model == gone:
            raise InferenceServerException("unknown model", status="404")
        return real(model, **kw)

    transport.get_model_config = config  # type: ignore[method-assign]
    names = [c["name"] for c in sync_client(transport).configs()]
    assert names == sorted(c["name"] for c in CONFIGS if c["name"] != gone)


def test_a_sibling_shares_the_breaker_and_discovery_but_not_the_transport() -> None:
    one = FakeTransport()
    with sync_client(one) as c:
        c.embed(["a"], route="bls")  # discovers
        twin = c.sibling()
        assert twin.breaker is c.breaker and twin.settings == c.settings
        assert twin._pipelines is c._pipelines
        assert twin._client is not c._client
        twin.close()


def test_served_configs_come_from_the_discovery_sources_every_task_client_shares(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's configs; ./model_repository where the server refused them (else a
    DiscoveryError naming what to set); a configured repository without asking the server."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(REPOSITORY_ENV, raising=False)
    names = sorted(c["name"] for c in sync_client(FakeTransport()).served_configs())
    assert names == sorted(c["name"] for c in CONFIGS)

    refusing = FakeTransport()

    def index(**kw: Any) -> Any:
        raise InferenceServerException("this API is restricted", status="403")

    refusing.get_model_repository_index = index  # type: ignore[method-assign]
    with pytest.raises(DiscoveryError, match=ADMIN_KEY_ENV):
        sync_client(refusing).served_configs()
    write_model(tmp_path / "model_repository", "mood", "mood", "ensemble", variant="fp32")
    assert [c["name"] for c in sync_client(refusing).served_configs()] == ["mood"]

    write_model(tmp_path / "elsewhere", "other", "other", "ensemble", variant="fp32")
    quiet = FakeTransport()
    configs = sync_client(quiet, repository=str(tmp_path / "elsewhere")).served_configs()
    assert [c["name"] for c in configs] == ["other"] and quiet.calls == []


def test_no_task_client_restates_the_configs_discovery() -> None:
    """The image and rerank clients (and any other) read configs through the core's one
    ``served_configs_flow``, never their own copy of the fallbacks."""
    for task in tasks.registry().values():
        path = task.folder / "client.py"
        if path.is_file():
            source = path.read_text()
            assert "configured_repository" not in source and "refused(" not in source, path
