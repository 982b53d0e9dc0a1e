"""In-process: what the encoder calls of BLS executes cost per encoder route on this CPU (#24).

``python -m tritonforge.loadtest.bench.int8_cpu --model-repository model_repository
[--graph qdq=PATH ...]`` tokenizes corpus texts as the BLS does (``--texts-per-execute`` one-text
requests per execute, merged per 16-token bucket by :func:`tritonforge.bls_calls.plan_encoder_calls`)
and runs every call of ``--executes`` executes through each route, in interleaved rounds, with
the served sessions' settings (the encoder config's threads and ``session.*`` entries):

* ``fp32``: the fp32 encoder, each call batched and cut to its longest row (as served);
* ``int8 rows``: the int8 encoder, each row alone at its own length (as served: dynamic int8
  quantizes activations per tensor, so batching would change answers);
* ``int8 batched``: the same graph batched (faster where batching pays, but batch-dependent);
* each ``--graph NAME=PATH`` (e.g. a static QDQ graph) batched and rows alone.

Per route: median wall and CPU ms per request (``time.process_time``, all threads), the ratio
to fp32, the cosine of its answers against fp32's (mean, min) and, batched, the largest change
of an answer between alone and batched (0 means batch-invariant). Speed goals are not asserted
here: compare the ratios of one run and report the load average beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tritonforge.batching import Batch, infer_rows, infer_trimmed
from tritonforge.bls import EncoderTarget, tokenizer_settings
from tritonforge.bls_calls import plan_encoder_calls
from tritonforge.modelconfig import ModelConfig
from tritonforge.ort_options import session_options
from tritonforge.repository import load_model_config
from tritonforge.text import TextTokenizer, split_tokens
from tritonforge.triton import pad_values_from

Feed = dict[str, np.ndarray]


@dataclass
class Route:
    name: str
    run: Callable[[Feed], np.ndarray]


def session(path: Path, config: ModelConfig) -> Any:
    """An ONNX Runtime session set up like the served encoder's (threads, ``session.*``)."""
    import onnxruntime as ort

    options = session_options(ort, config.parameters)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def route(name: str, sess: Any, config: ModelConfig, alone: bool) -> Route:
    """A route running one call's merged inputs like the served backend does."""
    output = next(o.name for o in sess.get_outputs())
    names = {t.name for t in sess.get_inputs()}
    axis_names = {
        t.name: [d if isinstance(d, str) else None for d in t.shape]
        for t in [*sess.get_inputs(), *sess.get_outputs()]
    }
    pads = pad_values_from(config)
    infer = infer_rows if alone else infer_trimmed

    def run_one(feed: Feed) -> dict[str, np.ndarray]:
        return {output: sess.run([output], feed)[0]}

    def run(inputs: Feed) -> np.ndarray:
        feed = {k: v for k, v in inputs.items() if k in names}
        return infer(feed, run_one, pads, axis_names)[output]

    return Route(name, run)


def workload(repository: Path, texts: Sequence[str], per_execute: int) -> list[list[Batch]]:
    """Per execute, the encoder calls the BLS makes for ``per_execute`` one-text requests."""
    tok = tokenizer_settings(repository, load_model_config(repository, "tokenizer"))
    tokenizer = TextTokenizer(
        tok.path, tok.max_length, tok.pad_to_multiple_of, outputs=tok.outputs, pad_id=tok.pad_id
    )
    target = EncoderTarget("encoder", {n: n for n in tok.outputs}, "out")
    executes = []
    for start in range(0, len(texts) - per_execute + 1, per_execute):
        chunk = list(texts[start : start + per_execute])
        parts = split_tokens(
            tokenizer.encode(chunk), [1] * len(chunk), pad_to_multiple_of=tok.pad_to_multiple_of
        )
        executes.append(plan_encoder_calls(list(enumerate(parts)), target))
    return executes


def outputs(r: Route, executes: Sequence[Sequence[Batch]]) -> list[np.ndarray]:
    return [r.run(b.inputs) for calls in executes for b in calls]


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    num = (a64 * b64).sum(-1)
    return np.asarray(num / (np.linalg.norm(a64, axis=-1) * np.linalg.norm(b64, axis=-1)))


def measure(
    routes: Sequence[Route], executes: Sequence[Sequence[Batch]], rounds: int
) -> dict[str, dict[str, float]]:
    """Interleaved rounds: each round runs every route over every execute's calls."""
    requests = sum(b.size for calls in executes for b in calls)
    wall: dict[str, list[float]] = {r.name: [] for r in routes}
    cpu: dict[str, list[float]] = {r.name: [] for r in routes}
    for r in routes:  # warm-up: every shape once
        outputs(r, executes[:2])
    for _ in range(rounds):
        for r in routes:
            t0, c0 = time.perf_counter(), time.process_time()
            outputs(r, executes)
            wall[r.name].append((time.perf_counter() - t0) * 1000.0 / requests)
            cpu[r.name].append((time.process_time() - c0) * 1000.0 / requests)
    base = statistics.median(wall[routes[0].name])
    base_cpu = statistics.median(cpu[routes[0].name])
    return {
        r.name: {
            "wall_ms_per_request": round(statistics.median(wall[r.name]), 2),
            "cpu_ms_per_request": round(statistics.median(cpu[r.name]), 2),
            "wall_vs_fp32": round(statistics.median(wall[r.name]) / base, 3),
            "cpu_vs_fp32": round(statistics.median(cpu[r.name]) / base_cpu, 3),
        }
        for r in routes
    }


def quality(
    routes: Sequence[Route], alone: Mapping[str, Route], executes: Sequence[Sequence[Batch]]
) -> dict[str, dict[str, float]]:
    """Cosine against the first route (fp32) and, for batched routes, the largest change of an
    answer between the route and the same graph rows alone."""
    reference = np.concatenate(outputs(routes[0], executes))
    out = {}
    for r in routes[1:]:
        got = np.concatenate(outputs(r, executes))
        cos = cosine(got, reference)
        row = {"mean_cosine": round(float(cos.mean()), 4), "min_cosine": round(float(cos.min()), 4)}
        if r.name in alone:
            solo = np.concatenate(outputs(alone[r.name], executes))
            row["max_abs_batched_vs_alone"] = float(np.abs(got - solo).max())
        out[r.name] = row
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from tritonforge.loadtest import corpus

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--fp32", default="encoder_fp32")
    parser.add_argument("--int8", default="encoder_int8")
    parser.add_argument(
        "--graph", action="append", default=[], help="NAME=PATH: another int8 graph to compare"
    )
    parser.add_argument("--texts-per-execute", type=int, default=12)
    parser.add_argument("--executes", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    repo = args.model_repository
    fp32_cfg, int8_cfg = load_model_config(repo, args.fp32), load_model_config(repo, args.int8)
    fp32 = session(repo / args.fp32 / "1" / "model.onnx", fp32_cfg)
    int8 = session(repo / args.int8 / "1" / "model.onnx", int8_cfg)
    routes = [
        route("fp32", fp32, fp32_cfg, alone=False),
        route("int8 rows", int8, int8_cfg, alone=True),
        route("int8 batched", int8, int8_cfg, alone=False),
    ]
    alone = {"int8 batched": routes[1]}
    for spec in args.graph:
        name, _, path = spec.partition("=")
        other = session(Path(path), int8_cfg)
        batched = route(f"{name} batched", other, int8_cfg, alone=False)
        routes += [batched, route(f"{name} rows", other, int8_cfg, alone=True)]
        alone[batched.name] = routes[-1]
    texts = corpus.generate()[: args.texts_per_execute * args.executes]
    executes = workload(repo, texts, args.texts_per_execute)
    calls = sum(len(c) for c in executes)
    print(
        f"{len(executes)} executes x {args.texts_per_execute} one-text requests = {calls} "
        f"encoder calls; load average {os.getloadavg()}"
    )
    result = {
        "speed": measure(routes, executes, args.rounds),
        "quality": quality(routes, alone, executes),
    }
    result["load_average_end"] = list(os.getloadavg())  # type: ignore[assignment]
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
