"""The supervisor's pure parts: which models depend on a broken one, which canary errors are
overload (never a restart), the restart back-off, the pipeline states; and the launcher's
process stop and metrics proxy that must survive restarts."""

from __future__ import annotations

import socket
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tritonforge.modelconfig import ModelConfig
from tritonforge.runtime.errors import ServerStartError
from tritonforge.runtime.launcher.logparse import ServerLog
from tritonforge.runtime.launcher.metrics import MetricsProxy
from tritonforge.runtime.launcher.planned_loads import PlannedLoads
from tritonforge.runtime.launcher.process import TritonProcess
from tritonforge.runtime.supervisor.canaries import (
    FAILED,
    OVERLOADED,
    classify_failure,
    unhealthy_stubs,
)
from tritonforge.runtime.supervisor.health import pipeline_states
from tritonforge.runtime.supervisor.model_graph import callees, dependents, model_calls, reload_plan
from tritonforge.runtime.supervisor.supervisor import Backoff, Supervisor


def _python(name: str, **params: str) -> ModelConfig:
    entries = "".join(
        f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in params.items()
    )
    return ModelConfig.from_pbtxt(f'name: "{name}"\nbackend: "python"\n{entries}')


def _ensemble(name: str, *steps: str) -> ModelConfig:
    body = "".join(f'step {{ model_name: "{s}" model_version: -1 }}\n' for s in steps)
    return ModelConfig.from_pbtxt(
        f'name: "{name}"\nplatform: "ensemble"\nensemble_scheduling {{\n{body}}}\n'
    )


@pytest.fixture
def calls() -> dict[str, set[str]]:
    """A repository shaped like the default one: two ensembles and a BLS share a tokenizer."""
    configs = {
        "tok": _python("tok", encoder_model="enc_a"),
        "enc_a": _python("enc_a"),
        "enc_b": _python("enc_b"),
        "post": _python("post"),
        "ens_a": _ensemble("ens_a", "tok", "enc_a"),
        "ens_b": _ensemble("ens_b", "tok", "enc_b"),
        "bls": _python("bls", tokenizer_model="tok", encoder_models="a=enc_a,b=enc_b"),
        "bls_post": _python("bls_post", postprocess_model="post", pipeline_model="bls"),
        "other": _python("other"),
    }
    return model_calls(configs)


def test_model_calls_reads_ensemble_steps_and_declared_bls_targets(
    calls: dict[str, set[str]],
) -> None:
    assert calls["ens_a"] == {"tok", "enc_a"}
    assert calls["bls"] == {"tok", "enc_a", "enc_b"}
    assert calls["tok"] == {"enc_a"}  # a tokenizer that reads its encoder's config
    assert calls["other"] == set()


def test_dependents_are_every_transitive_caller(calls: dict[str, set[str]]) -> None:
    # finding 1: the tokenizer's callers must come back with it
    assert dependents(calls, ["tok"]) == {"ens_a", "ens_b", "bls", "bls_post"}
    assert dependents(calls, ["enc_b"]) == {"ens_b", "bls", "bls_post"}
    assert dependents(calls, ["other"]) == set()
    assert callees(calls, "ens_b") == {"ens_b", "tok", "enc_a", "enc_b"}


def test_reload_plan_loads_the_broken_model_first_then_callers_after_their_callees(
    calls: dict[str, set[str]],
) -> None:
    waves = reload_plan(calls, ["tok"])
    assert waves[0] == ["tok"]
    assert sorted(m for w in waves for m in w) == ["bls", "bls_post", "ens_a", "ens_b", "tok"]
    position = {m: i for i, wave in enumerate(waves) for m in wave}
    assert position["bls_post"] > position["bls"] > position["tok"]
    assert reload_plan(calls, ["other"]) == [["other"]]
    assert reload_plan({"x": {"y"}, "y": {"x"}, "z": {"x"}}, ["z"]) == [["z"]]


@pytest.mark.parametrize(
    "error",
    [
        "InferenceServerException: StatusCode.UNAVAILABLE Exceeds maximum queue size",
        "InferenceServerException: [StatusCode.UNAVAILABLE] generate: queue full (64 waiting)",
        "InferenceServerException: StatusCode.DEADLINE_EXCEEDED Deadline Exceeded",
        "TimeoutError: deadline: no final response within 10 s",
        "InferenceServerException: StatusCode.RESOURCE_EXHAUSTED too many requests",
        "InferenceServerException: StatusCode.UNAVAILABLE no answer from tritonserver within "
        "request_timeout_s=60",
    ],
)
def test_busy_answers_are_overload_not_death(error: str) -> None:
    assert classify_failure(error) == OVERLOADED


@pytest.mark.parametrize(
    "error",
    [
        "InferenceServerException: StatusCode.INTERNAL Failed to process the request(s) for "
        "model instance 'tokenizer_0_0', message: Stub process 'tokenizer_0_0' is not healthy.",
        "InferenceServerException: StatusCode.UNAVAILABLE Request for unknown model: 'embed' has "
        "no available versions",
        "InferenceServerException: StatusCode.INTERNAL embed: internal error (KeyError)",
    ],
)
def test_broken_answers_are_failures(error: str) -> None:
    assert classify_failure(error) == FAILED


def test_unhealthy_stubs_names_the_instance() -> None:
    error = "message: Stub process 'tokenizer_0_1' is not healthy. and 'tokenizer_0_1'"
    assert unhealthy_stubs(error) == ["tokenizer_0_1"]
    assert unhealthy_stubs("Exceeds maximum queue size") == []


def test_backoff_doubles_up_to_its_cap_and_resets_after_a_stable_run() -> None:
    backoff = Backoff(base_s=1.0, cap_s=8.0, stable_s=60.0)
    backoff.started(0.0)
    delays = []
    for i in range(6):
        delays.append(backoff.next_delay_s(1.0 + i))
        backoff.started(1.0 + i)
    assert delays == [0.0, 1.0, 2.0, 4.0, 8.0, 8.0]
    assert backoff.next_delay_s(100.0) == 0.0  # up for 94 s since the last start


def test_pipeline_state_is_its_worst_model() -> None:
    owner = {"embed": "embed", "embed_bls": "embed", "generate": "generate", "classify": "cl"}
    models = {
        "embed": "ok",
        "embed_bls": "recovering: stub died",
        "generate": "overloaded: queue full",
        "classify": "ok",
    }
    assert pipeline_states(models, owner) == {
        "embed": "recovering",
        "generate": "overloaded",
        "cl": "ok",
    }


def test_stopping_a_process_twice_or_with_its_watchdog_pipe_closed_is_harmless() -> None:
    """Finding 3: two stops at once (supervisor restart + signal) raised ``ValueError: write to
    closed file`` in the supervisor thread."""
    process = TritonProcess(ServerLog())
    process.launch(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        {"PATH": "/usr/bin:/bin"},
        private_shm=False,
        shm_limit_bytes=1 << 20,
    )
    assert process._watchdog is not None and process._watchdog.stdin is not None
    process._watchdog.stdin.close()  # the other stop got there first
    errors: list[BaseException] = []

    def stop() -> None:
        try:
            process.stop(timeout_s=5)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=stop) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    assert process.returncode is not None
    assert process.stop(timeout_s=5) == process.returncode


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_metrics_proxy_holds_its_port_and_answers_503_while_triton_is_down() -> None:
    """Finding 8: the public metrics port stays bound while tritonserver restarts."""

    class Upstream(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"nv_inference_count 1\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return

    upstream = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    current: list[int | None] = [int(upstream.server_address[1])]
    proxy = MetricsProxy("127.0.0.1", _free_port(), lambda: current[0])
    url = f"http://127.0.0.1:{proxy.port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            assert resp.read() == b"nv_inference_count 1\n"
            assert resp.headers["Content-Type"].startswith("text/plain")
        current[0] = None  # restarting
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url, timeout=5)
        assert err.value.code == 503
        with pytest.raises(ServerStartError, match="--metrics-port"):
            MetricsProxy("127.0.0.1", proxy.port, lambda: None)
    finally:
        proxy.stop()
        upstream.shutdown()
        upstream.server_close()


class FakeServer:
    """What the supervisor reads of an EmbeddedServer (unit tests of its decisions only; the
    integration tests run the real one)."""

    def __init__(self, repository: Path) -> None:
        from types import SimpleNamespace

        self.settings = SimpleNamespace(
            model_repository=repository, front=False, model_control_mode="explicit"
        )
        self.pid: int | None = 100
        self.returncode: int | None = None
        self.loaded: list[str] = []
        self.restarts = 0
        self.stub_table = {"tok_0_0": (1, "tok"), "enc_0_0": (2, "enc"), "gen_0_0": (3, "gen")}
        self.events: list[str] = []  # loads and stream endings, in order
        self.end_reasons: list[str] = []
        self.planned = PlannedLoads()

    def stubs(self) -> dict[str, tuple[int, str]]:
        return dict(self.stub_table)

    def stub_pids(self) -> dict[str, int]:
        return {k: v[0] for k, v in self.stub_table.items()}

    def load_model(self, model: str, timeout_s: float = 120.0, force: bool = False) -> None:
        with self.planned.loading([model]):
            self.loaded.append(model)
            self.events.append(f"load {model}")

    def end_streams(
        self, models: Iterable[str], reason: str, opened_before_s: float | None = None
    ) -> int:
        self.events.append(f"end {','.join(sorted(models))} {opened_before_s is not None}")
        self.end_reasons.append(reason)
        return 1

    def restart(self) -> None:
        self.restarts += 1
        self.returncode = None


def _repo(tmp_path: Path) -> Path:
    configs = {
        "tok": 'name: "tok"\nbackend: "python"\ninput { name: "text" data_type: TYPE_STRING dims: 1 }',
        "enc": 'name: "enc"\nbackend: "python"',
        "ens": 'name: "ens"\nplatform: "ensemble"\ninput { name: "text" data_type: TYPE_STRING dims: 1 }\n'
        'ensemble_scheduling { step { model_name: "tok" model_version: -1 }\n'
        'step { model_name: "enc" model_version: -1 } }',
        "gen": 'name: "gen"\nbackend: "python"\ninput { name: "text" data_type: TYPE_STRING dims: 1 }',
    }
    for name, text in configs.items():
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(text)
    return tmp_path


class Scripted(Supervisor):
    def __init__(self, server: FakeServer, answers: list[dict[str, str]]) -> None:
        super().__init__(server, ["ens", "gen"])  # type: ignore[arg-type]
        self.answers = answers
        self.asked: list[list[str] | None] = []  # the models of each canary round (None: all)

    def canary(
        self, models: Iterable[str] | None = None, concurrent: bool = False
    ) -> dict[str, str]:
        self.asked.append(None if models is None else sorted(models))
        answer = self.answers.pop(0) if self.answers else {"ens": "ok", "gen": "ok"}
        return {m: v for m, v in answer.items() if models is None or m in set(models)}


def test_overloaded_canaries_never_reload_or_restart(tmp_path: Path) -> None:
    """Finding 2a: the canary of a flooded model refused again and again restarts nothing."""
    server = FakeServer(_repo(tmp_path))
    busy = {"ens": "ok", "gen": "overloaded: StatusCode.UNAVAILABLE generate: overloaded"}
    supervisor = Scripted(server, [busy] * 10)
    for _ in range(10):
        supervisor._probe_once()
        supervisor._watch_once()
        assert not supervisor.health().healthy
        assert supervisor.health().pipelines == {"ens": "ok", "gen": "overloaded"}
    assert server.loaded == [] and server.restarts == 0
    supervisor._probe_once()
    assert supervisor.health().healthy


def test_a_dead_stub_reloads_its_model_and_its_callers_never_the_server(tmp_path: Path) -> None:
    """Finding 1: the tokenizer dies; it and the ensemble that calls it are reloaded."""
    server = FakeServer(_repo(tmp_path))
    supervisor = Scripted(server, [])
    supervisor._snapshot_stubs()
    server.stub_table["tok_0_0"] = (11, "tok")  # a new PID: the old stub is gone
    supervisor._watch_once()
    assert server.loaded == ["tok"] and server.restarts == 0  # the ensemble answers again
    health = supervisor.health()
    assert health.model_reloads == 1 and health.server_restarts == 0
    assert "tok_0_0" in health.last_restart_reason


def test_a_dead_stub_ends_the_open_streams_to_it_and_its_callers(tmp_path: Path) -> None:
    """Chaos finding: streams in flight on a decoupled model whose stub died never got their
    final response (hung 60 s, measured). The supervisor ends the front's streams to the dead
    model and to every public model calling it: at once, and again after the reload for those
    that reached the dead instance meanwhile (Triton routes to it until the new one is in)."""
    server = FakeServer(_repo(tmp_path))
    supervisor = Scripted(server, [])
    supervisor._snapshot_stubs()
    server.stub_table["gen_0_0"] = (13, "gen")
    supervisor._watch_once()
    assert server.events == ["end gen False", "load gen", "end gen True"]
    assert all("gen is unavailable: its stub crashed" in r for r in server.end_reasons)
    server.events.clear()
    server.stub_table["tok_0_0"] = (11, "tok")
    supervisor._watch_once()
    assert server.events == ["end ens,tok False", "load tok", "end ens,tok True"]


def test_a_canary_naming_an_unhealthy_stub_ends_its_streams_too(tmp_path: Path) -> None:
    """Measured in the 10-min chaos: a stub killed while another reload held the supervisor
    was found by a canary ("Stub process 'generate_0_0' is not healthy"), not by its PID; its
    streams are orphaned just the same."""
    server = FakeServer(_repo(tmp_path))
    sick = "failed: StatusCode.INTERNAL Stub process 'gen_0_0' is not healthy."
    supervisor = Scripted(server, [{"ens": "ok", "gen": sick}])
    supervisor._snapshot_stubs()
    supervisor._probe_once()
    supervisor._watch_once()
    assert server.events == ["end gen False", "load gen", "end gen True"]


def test_a_reload_canaries_only_the_models_it_affects(tmp_path: Path) -> None:
    """Measured in the 10-min chaos at load 26: each recovery ran two full canary rounds (every
    public model, generate's waiting up to its timeout under a flood), so one took ~50 s and the
    next dead stub waited for it. A recovery canaries only the models calling what it reloads."""
    server = FakeServer(_repo(tmp_path))
    supervisor = Scripted(server, [])
    supervisor._snapshot_stubs()
    supervisor._record({"ens": "ok", "gen": "overloaded: busy"})
    server.stub_table["tok_0_0"] = (11, "tok")
    supervisor._watch_once()
    # one canary of the affected models after the reload; what answered OK is not asked again
    # (the second round cost a canary's time per recovery, under load seconds)
    assert supervisor.asked == [["ens"]]
    assert supervisor.health().models == {"ens": "ok", "gen": "overloaded: busy"}


def test_a_reload_asked_by_failing_canaries_ends_no_stream(tmp_path: Path) -> None:
    """A model whose stub is alive may still be answering its streams: only a dead stub's
    streams are ended."""
    server = FakeServer(_repo(tmp_path))
    broken = {"ens": "ok", "gen": "failed: StatusCode.INTERNAL something broke"}
    supervisor = Scripted(server, [broken, broken])
    supervisor._snapshot_stubs()
    for _ in range(2):
        supervisor._probe_once()
    supervisor._watch_once()
    assert server.events == ["load gen"]


def test_a_caller_still_broken_after_the_reload_is_reloaded_too(tmp_path: Path) -> None:
    """Finding 1: the ensemble kept answering "Stub process ... is not healthy" after the
    tokenizer came back; a dependent whose canary still fails is reloaded as well."""
    server = FakeServer(_repo(tmp_path))
    sick = "failed: StatusCode.INTERNAL in ensemble 'ens', Stub process 'tok_0_0' is not healthy."
    supervisor = Scripted(server, [{"ens": sick, "gen": "ok"}])
    supervisor._snapshot_stubs()
    server.stub_table["tok_0_0"] = (11, "tok")
    supervisor._watch_once()
    assert server.loaded == ["tok", "ens"] and server.restarts == 0
    assert "reloaded tok, ens" in supervisor.health().last_restart_reason


def test_a_canary_naming_an_unhealthy_stub_reloads_it_at_once(tmp_path: Path) -> None:
    server = FakeServer(_repo(tmp_path))
    sick = "failed: StatusCode.INTERNAL Stub process 'tok_0_0' is not healthy."
    supervisor = Scripted(server, [{"ens": sick, "gen": "ok"}])
    supervisor._snapshot_stubs()
    supervisor._probe_once()
    supervisor._watch_once()
    assert server.loaded == ["tok"] and server.restarts == 0


def test_only_a_tritonserver_exit_restarts_the_server(tmp_path: Path) -> None:
    server = FakeServer(_repo(tmp_path))
    broken = {"ens": "failed: StatusCode.INTERNAL ens: internal error (KeyError)", "gen": "ok"}
    supervisor = Scripted(server, [broken, broken])
    supervisor._snapshot_stubs()
    supervisor._probe_once()
    supervisor._watch_once()
    assert server.loaded == [] and server.restarts == 0  # once may be a blip
    supervisor._probe_once()
    supervisor._watch_once()
    # twice: the model and everything it calls are reloaded, still no server restart
    assert sorted(server.loaded) == ["enc", "ens", "tok"] and server.restarts == 0
    server.returncode = -11
    supervisor._watch_once()
    health = supervisor.health()
    assert server.restarts == 1 and health.server_restarts == 1
    assert health.last_server_restart_reason == "tritonserver exited with status -11"


def test_a_stub_that_dies_during_another_reload_is_still_seen_dead(tmp_path: Path) -> None:
    """Chaos: the tokenizer died while the encoder was being reloaded; the snapshot taken after
    that reload must not adopt the tokenizer's absence."""
    server = FakeServer(_repo(tmp_path))
    supervisor = Scripted(server, [])
    supervisor._snapshot_stubs()
    server.stub_table["enc_0_0"] = (12, "enc")
    del server.stub_table["tok_0_0"]  # died meanwhile, not yet back
    supervisor._recover({"enc"}, "stub process of enc_0_0 died", ["enc_0_0"])
    assert server.loaded == ["enc"]
    assert supervisor.dead_stubs() == ["tok_0_0"]
    supervisor._watch_once()
    assert server.loaded == ["enc", "tok"]


def test_stop_stream_ends_the_request_iterator_after_a_cancel() -> None:
    """tritonclient's ``stop_stream(cancel_requests=True)`` never ends the request iterator, so
    gRPC's feeding thread blocked forever: one thread leaked per canary stream (the 10-min chaos
    process reached 4,900 threads). ``stop_stream`` ends it."""
    import queue
    from types import SimpleNamespace

    from tritonforge.runtime.supervisor.canaries import stop_stream

    requests: queue.Queue[object] = queue.Queue()
    calls: list[bool] = []

    class Client:
        _stream = SimpleNamespace(_request_queue=requests)

        def stop_stream(self, cancel_requests: bool = False) -> None:
            calls.append(cancel_requests)
            self._stream = None  # as tritonclient does

    stop_stream(Client())
    assert calls == [True] and requests.get_nowait() is None


def test_a_concurrent_canary_round_asks_every_model_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A recovery's check of the models it affects waits for the slowest canary, not their sum:
    every canary is in flight together (a barrier they all must reach)."""
    from tritonforge.runtime.supervisor import canaries

    barrier = threading.Barrier(3, timeout=10)

    def once(url: str, name: str, config: object, timeout_s: float) -> str:
        barrier.wait()  # breaks (BrokenBarrierError) unless all three run at once
        return f"ok-{name}"

    monkeypatch.setattr(canaries, "canary_once", once)
    configs = dict.fromkeys(["a", "b", "c", "d"], None)
    got = canaries.canary_round("unix:x", configs, 1.0, ["c", "a", "b"], concurrent=True)  # type: ignore[arg-type]
    assert got == {"a": "ok-a", "b": "ok-b", "c": "ok-c"}


def test_a_stub_retired_by_a_planned_load_is_no_crash(tmp_path: Path) -> None:
    """Issue #36 item 3: a staged load replaces a model's stubs (the old ones exit); while the
    load runs and after it, the supervisor reloads nothing, then watches the new stubs."""
    server = FakeServer(_repo(tmp_path))
    supervisor = Scripted(server, [])
    supervisor._snapshot_stubs()
    with server.planned.loading(["tok"]):  # a background export's load of the tokenizer
        del server.stub_table["tok_0_0"]  # Triton retired the old instance
        assert supervisor.dead_stubs() == []
        server.stub_table["tok_0_0"] = (21, "tok")  # the new instance
    assert supervisor.dead_stubs() == []
    supervisor._watch_once()
    assert server.loaded == [] and supervisor.health().model_reloads == 0
    server.stub_table["tok_0_0"] = (22, "tok")  # the new stub crashes later: that is one
    assert supervisor.dead_stubs() == ["tok_0_0"]


def test_a_finished_load_whose_old_stub_exits_late_is_no_crash(tmp_path: Path) -> None:
    """The load returned before the old stub exited: the PID recorded is the new one."""
    server = FakeServer(_repo(tmp_path))
    supervisor = Scripted(server, [])
    supervisor._snapshot_stubs()
    with server.planned.loading(["tok"]):
        server.stub_table["tok_0_0"] = (31, "tok")
    del server.stub_table["tok_0_0"]  # read between the load's end and the next snapshot
    assert supervisor.dead_stubs() == []
    server.stub_table["tok_0_0"] = (31, "tok")
    assert supervisor.dead_stubs() == []


def test_an_ensemble_load_retires_its_steps_stubs_on_purpose(tmp_path: Path) -> None:
    """Triton loads an ensemble's steps with it; another model's stub dying meanwhile is still
    a crash."""
    server = FakeServer(_repo(tmp_path))
    supervisor = Scripted(server, [])
    supervisor._snapshot_stubs()
    with server.planned.loading(["ens"]):
        server.stub_table["tok_0_0"] = (41, "tok")
        server.stub_table["enc_0_0"] = (42, "enc")
        server.stub_table["gen_0_0"] = (43, "gen")  # not a step of ens: a crash
        assert supervisor.dead_stubs() == ["gen_0_0"]
    assert supervisor.dead_stubs() == ["gen_0_0"]


def test_planned_loads_count_generations_even_when_a_load_fails() -> None:
    planned = PlannedLoads()
    with pytest.raises(RuntimeError), planned.loading(["m"]):
        assert planned.busy("m")
        raise RuntimeError("load failed")
    assert not planned.busy("m") and planned.generation("m") == 1
