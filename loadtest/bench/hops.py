"""Where a 1-client text request's time goes, hop by hop:
``python -m tritonforge.loadtest.bench.hops [--pipeline-name N] [--variant fp32] [--requests 200]``.

Serves the pipeline's ensemble, tokenizer and encoder twice, behind the front and with Triton on
the TCP ports itself (``front=False``), and sends the same corpus texts over gRPC, one at a time,
alternating the two servers request by request (noise hits both alike):

- ``ready``: ``ServerReady`` (a protocol round trip with no model behind it);
- ``tokenizer``: the tokenizer model alone; ``encoder``: the encoder alone, fed the ids the served
  tokenizer produced; ``ensemble``: the whole pipeline;
- in this process, after the above: the served tokenization (:class:`TextTokenizer`)
  and the encoder's ONNX graph with the served session options (spinning off, as exported) and with
  ONNX Runtime's defaults (spinning on: the in-process limit's session), on the same padded ids.

Per call: wall-clock latency, and CPU time per request of tritonserver, of each Python stub (by
model) and of this process (the client, plus the front's thread on the front server: the front's
CPU is the difference). Triton's statistics per model give queue and compute times. Prints one
table per measurement and a JSON summary (``--json PATH``). Load and noise: a hop's latency is the
median of its calls; the machine's load average is printed with it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tritonforge import tasks
from tritonforge.loadtest import corpus
from tritonforge.loadtest.bench.runners import model_stats, stats_delta, tree_cpu_s
from tritonforge.loadtest.discovered import pipelines, stage_model
from tritonforge.logs import run_main
from tritonforge.ort_options import session_options
from tritonforge.pipelines import Pipeline
from tritonforge.repository import load_model_config, referenced_models
from tritonforge.runtime.launcher.settings import ServerSettings
from tritonforge.runtime.serving import EmbeddedServer
from tritonforge.text import TextTokenizer, served_tokenizer

log = logging.getLogger(__name__)
PATHS = ("front", "direct")


def self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def stub_cpu_s(server: EmbeddedServer) -> dict[str, float]:
    """CPU seconds so far per model, summed over its Python stubs (instances)."""
    import psutil

    out: dict[str, float] = {}
    for _instance, (pid, model) in server.stubs().items():
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(pid).cpu_times()
            out[model] = out.get(model, 0.0) + t.user + t.system
    return out


@contextlib.contextmanager
def trimmed_repository(repository: Path, models: Sequence[str]) -> Iterator[Path]:
    """A temporary repository holding only ``models`` (symlinks to the originals)."""
    with tempfile.TemporaryDirectory(prefix="tritonforge-hops-") as tmp:
        root = Path(tmp)
        for name in models:
            (root / name).symlink_to((repository / name).resolve(), target_is_directory=True)
        yield root


def encoder_session(path: Path, config_params: dict[str, str], served: bool) -> Any:
    """ONNX Runtime session as the served encoder builds it (``served``) or with ORT's defaults
    for the session config (spinning on), both with the served thread counts."""
    import onnxruntime as ort

    options = session_options(ort, config_params, session_entries=served)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class Hop:
    """One measured call: latencies and the CPU it used per process group."""

    def __init__(self, name: str, path: str) -> None:
        self.name, self.path = name, path
        self.latency_ms: list[float] = []
        self.client_cpu_s = 0.0

    def call(self, fn: Callable[[], object]) -> None:
        cpu, t0 = self_cpu_s(), time.perf_counter()
        fn()
        self.latency_ms.append((time.perf_counter() - t0) * 1e3)
        self.client_cpu_s += self_cpu_s() - cpu

    def summary(self) -> dict[str, Any]:
        n = len(self.latency_ms)
        return {
            "hop": self.name,
            "path": self.path,
            "calls": n,
            "p50_ms": statistics.median(self.latency_ms) if n else float("nan"),
            "mean_ms": statistics.fmean(self.latency_ms) if n else float("nan"),
            "this_process_cpu_ms": self.client_cpu_s * 1e3 / max(1, n),
        }


def grpc_text(model: str, field: str, text: str) -> tuple[str, list[Any]]:
    import tritonclient.grpc as grpcclient

    tensor = grpcclient.InferInput(field, [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[text.encode()]], dtype=np.object_))
    return model, [tensor]


def grpc_arrays(model: str, arrays: dict[str, np.ndarray]) -> tuple[str, list[Any]]:
    import tritonclient.grpc as grpcclient

    tensors = []
    for name, value in arrays.items():
        t = grpcclient.InferInput(name, list(value.shape), "INT64")
        t.set_data_from_numpy(value)
        tensors.append(t)
    return model, tensors


@dataclass(frozen=True)
class Subject:
    """The measured pipeline: its ensemble, tokenizer and encoder models, as served."""

    repo: Path
    pipeline: Pipeline
    ensemble: str
    tokenizer_model: str
    encoder_model: str
    encoder_config: Any
    tokenizer: TextTokenizer
    steps: tuple[str, ...] = ()  # every model the ensemble calls (a postprocess too)

    @property
    def models(self) -> list[str]:
        return list(
            dict.fromkeys([self.ensemble, self.tokenizer_model, self.encoder_model, *self.steps])
        )


def ensemble_steps(repo: Path, ensemble: str) -> tuple[str, ...]:
    """The models an ensemble's ``ensemble_scheduling`` calls, in order (its config is the
    contract), and the models those name in their parameters (a fused step reads its tokenizer's,
    encoder's and postprocess's configs and files), sorted by name."""
    steps = load_model_config(repo, ensemble).raw.get("ensemble_scheduling", {}).get("step", [])
    names = [str(s["model_name"]) for s in steps]
    named = [
        m for n in names for m in referenced_models(load_model_config(repo, n).parameters).values()
    ]
    return tuple(dict.fromkeys([*names, *sorted(named)]))


def subject(args: argparse.Namespace) -> Subject:
    """``--pipeline-name`` (else the first embedding pipeline) at ``--variant``."""
    repo = Path(args.model_repository)
    pipeline: Pipeline = (
        pipelines(repo)[args.pipeline_name]
        if args.pipeline_name
        else next(p for p in pipelines(repo).values() if p.task == tasks.default().name)
    )
    tokenizer_model = stage_model(repo, pipeline, "tokenizer")
    encoder_model = stage_model(repo, pipeline, "encoder", args.variant)
    assert tokenizer_model and encoder_model, f"{pipeline.name}: no tokenizer/encoder stage"
    pad_to = load_model_config(repo, tokenizer_model).param("pad_to_multiple_of", 1, int)
    return Subject(
        repo=repo,
        pipeline=pipeline,
        ensemble=pipeline.ensembles[args.variant],
        tokenizer_model=tokenizer_model,
        encoder_model=encoder_model,
        encoder_config=load_model_config(repo, encoder_model),
        tokenizer=served_tokenizer(repo / tokenizer_model, pad_to_multiple_of=pad_to),
        steps=ensemble_steps(repo, pipeline.ensembles[args.variant]),
    )


def _stage_ms(delta: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per model, the mean ms per count of each statistics stage."""
    return {
        m: {
            key: v.get(f"{key}_ns", 0.0) / max(1.0, v.get(f"{key}_count", 0.0)) / 1e6
            for key in ("queue", "compute_input", "compute_infer", "compute_output")
        }
        for m, v in delta.items()
    }


def _served_calls(
    sub: Subject, clients: dict[str, Any], texts: list[str], ids: list[dict[str, Any]]
) -> dict[str, Callable[[str, int], object]]:
    """The server calls, by hop: ``call(path, text index)``."""
    field = sub.pipeline.input
    return {
        "ready": lambda p, i: clients[p].is_server_ready(),
        "tokenizer": lambda p, i: clients[p].infer(
            *grpc_text(sub.tokenizer_model, field, texts[i])
        ),
        "encoder": lambda p, i: clients[p].infer(*grpc_arrays(sub.encoder_model, ids[i])),
        "ensemble": lambda p, i: clients[p].infer(*grpc_text(sub.ensemble, field, texts[i])),
    }


def _in_process_calls(
    sub: Subject, texts: list[str], ids: list[dict[str, Any]]
) -> dict[str, Callable[[int], object]]:
    """The in-process calls, by hop: the served tokenizer and the encoder graph two ways."""
    fed = {i.name for i in sub.encoder_config.inputs}
    filename = sub.encoder_config.default_model_filename or "model.onnx"
    onnx = sub.repo / sub.encoder_model / "1" / filename
    sessions = {
        label: encoder_session(onnx, dict(sub.encoder_config.parameters), served)
        for label, served in (("served options", True), ("ORT defaults", False))
    }

    def graph(session: Any) -> Callable[[int], object]:
        return lambda i: session.run(None, {k: v for k, v in ids[i].items() if k in fed})

    return {
        "tokenize (served settings)": lambda i: sub.tokenizer.encode([texts[i]]),
        **{f"encoder graph ({label})": graph(s) for label, s in sessions.items()},
    }


def _time_served(
    name: str,
    fn: Callable[[str, int], object],
    servers: dict[str, EmbeddedServer],
    requests: int,
    n_texts: int,
    hop: Callable[[str, str], Hop],
) -> dict[str, Any]:
    """``requests`` calls of ``fn`` alternating the paths; per path, the server-side costs."""
    before = {p: model_stats(s.http_url, s.admin_headers) for p, s in servers.items()}
    cpu0 = {p: tree_cpu_s(s.pid) for p, s in servers.items()}
    stubs0 = {p: stub_cpu_s(s) for p, s in servers.items()}
    for k in range(requests):
        i = k % n_texts
        for p in PATHS:
            hop(name, p).call(lambda f=fn, p=p, i=i: f(p, i))  # type: ignore[misc]
    per_call: dict[str, Any] = {}
    for p, s in servers.items():
        stubs1 = stub_cpu_s(s)
        per_call[f"{name}/{p}"] = {
            "tritonserver_tree_cpu_ms": (tree_cpu_s(s.pid) - cpu0[p]) * 1e3 / requests,
            "stub_cpu_ms": {
                m: (v - stubs0[p].get(m, 0.0)) * 1e3 / requests for m, v in stubs1.items()
            },
            "stats": _stage_ms(stats_delta(before[p], model_stats(s.http_url, s.admin_headers))),
        }
    return per_call


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import tritonclient.grpc as grpcclient

    sub = subject(args)
    texts = corpus.generate()[: args.texts]
    hops: dict[tuple[str, str], Hop] = {}

    def hop(name: str, path: str) -> Hop:
        return hops.setdefault((name, path), Hop(name, path))

    result: dict[str, Any] = {
        "pipeline": sub.pipeline.name,
        "ensemble": sub.ensemble,
        "load_average_at_start": os.getloadavg(),
    }
    with contextlib.ExitStack() as stack:
        root = stack.enter_context(trimmed_repository(sub.repo, sub.models))
        servers = {
            path: stack.enter_context(
                EmbeddedServer(ServerSettings.ephemeral(root, front=path == "front"))
            )
            for path in PATHS
        }
        for s in servers.values():
            s.wait_ready()
        clients = {p: grpcclient.InferenceServerClient(s.grpc_url) for p, s in servers.items()}
        ids = []
        for text in texts:  # the served tokenizer's own output feeds the encoder-alone calls
            out = clients["direct"].infer(*grpc_text(sub.tokenizer_model, sub.pipeline.input, text))
            ids.append({o.name: out.as_numpy(o.name) for o in sub.encoder_config.inputs})
        calls = _served_calls(sub, clients, texts, ids)
        inproc = _in_process_calls(sub, texts, ids)
        for name in calls:  # warm-up
            for p in PATHS:
                for i in range(min(10, len(texts))):
                    calls[name](p, i)
        for warm in inproc.values():
            for i in range(min(10, len(texts))):
                warm(i)
        per_call: dict[str, Any] = {}
        for name, fn in calls.items():
            per_call |= _time_served(name, fn, servers, args.requests, len(texts), hop)
        # In-process last, each by itself: a spinning session keeps its threads busy after a run
        # and would tax whatever runs next.
        for label, f in inproc.items():
            for k in range(args.requests):
                i = k % len(texts)
                hop(label, "in-process").call(lambda f=f, i=i: f(i))  # type: ignore[misc]
            time.sleep(0.1)
        result["hops"] = [h.summary() for h in hops.values()]
        result["servers"] = per_call
    result["load_average_at_end"] = os.getloadavg()
    return result


def report(result: dict[str, Any]) -> str:
    out = [
        f"{result['ensemble']}: 1 client, gRPC; load average "
        f"{result['load_average_at_start'][0]:.2f} -> {result['load_average_at_end'][0]:.2f}",
        f"{'hop':<34}{'path':<12}{'p50 ms':>8}{'mean ms':>9}{'this proc cpu ms':>18}"
        f"{'triton tree cpu ms':>20}",
    ]
    for h in result["hops"]:
        server = result["servers"].get(f"{h['hop']}/{h['path']}", {})
        tree = server.get("tritonserver_tree_cpu_ms", float("nan"))
        out.append(
            f"{h['hop']:<34}{h['path']:<12}{h['p50_ms']:8.2f}{h['mean_ms']:9.2f}"
            f"{h['this_process_cpu_ms']:18.2f}{tree:20.2f}"
        )
    out.append("Triton statistics per model (ms per request) and stub CPU ms per request:")
    for key, server in result["servers"].items():
        for model, s in sorted(server["stats"].items()):
            stub = server["stub_cpu_ms"].get(model)
            out.append(
                f"  {key:<18}{model:<24} queue {s['queue']:5.2f}  in {s['compute_input']:5.2f}  "
                f"infer {s['compute_infer']:6.2f}  out {s['compute_output']:5.2f}"
                + (f"  stub cpu {stub:6.2f}" if stub is not None else "")
            )
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tritonforge.loadtest.bench.hops", description=__doc__
    )
    parser.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--pipeline-name", default=None, help="default: the first embedding one")
    parser.add_argument("--variant", default="fp32")
    parser.add_argument("--requests", type=int, default=200, help="per hop and path")
    parser.add_argument("--texts", type=int, default=64, help="corpus texts cycled through")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    result = measure(args)
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
