"""Speed experiments on the int8 decoder's decode step, measured before kept (issue 20 item 1).

In-process, interleaved (every repeat measures every candidate once, so a load swing on the
shared machine hits all alike), one decode step at batch 1 and 16 with 64 cached columns:

- ONNX Runtime session options: intra-op threads, spinning off, graph optimisation level,
  ``session.use_env_allocators``;
- IO binding: the step's presents stay ORT values and are bound as the next step's pasts (no
  numpy copy of the cache), against ``session.run`` with numpy arrays;
- weight-only ``MatMulNBits`` bits (4, 8) and block size (32, 128), each with the export's gate:
  teacher-forced top-1 agreement with fp32's greedy tokens and held-out perplexity ratio;
- ``--sweep``: decode-step time against batch size (1, 4, 8, 16 rows at a realistic cache
  length) and one batched prefill, for fp32 and every int8/int4 candidate (bits, block size,
  ``accuracy_level`` 4 = int8 compute vs 0 = fp32 compute), each with its gate.

``python -m tritonforge.tasks.generation.loadtest.decoder_experiments [--quantize]`` writes
``build/decoder_experiments.json``; the numbers are recorded in docs/performance.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tritonforge.decoder import ATTENTION_MASK, INPUT_IDS, POSITION_IDS, OrtDecoder
from tritonforge.kv_batch import LEFT
from tritonforge.logs import run_main
from tritonforge.modelconfig import ModelConfig

# named, not __name__: run as `python -m` that is __main__, which logging leaves at warning
log = logging.getLogger("tritonforge.tasks.generation.loadtest.decoder_experiments")

PAST = 64
BATCHES = (1, 16)
STEPS = 8  # decode steps per measurement (the cache grows as served)


def session(
    path: Path, threads: int = 2, opt: str = "all", config: dict[str, str] | None = None
) -> Any:
    """A decoder session like :class:`OrtDecoder`'s with ``config`` session entries and
    ``opt`` (``basic``/``extended``/``all``) as the optimisation level."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = {
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[opt]
    for k, v in (config or {}).items():
        opts.add_session_config_entry(k, v)
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def numpy_steps(sess: Any, meta: OrtDecoder, batch: int) -> float:
    """Seconds for :data:`STEPS` decode steps through ``session.run`` (numpy in, numpy out)."""
    past = [np.zeros((batch, meta.kv_heads, PAST, meta.head_dim), np.float32)] * len(meta.past)
    t = time.perf_counter()
    for s in range(STEPS):
        n = PAST + s
        feed = {
            INPUT_IDS: np.full((batch, 1), 5, np.int64),
            ATTENTION_MASK: np.ones((batch, n + 1), np.int64),
            **dict(zip(meta.past, past, strict=True)),
        }
        if meta.layout == LEFT:  # a right-padded graph derives positions from the mask
            feed[POSITION_IDS] = np.full((batch, 1), n, np.int64)
        _, *past = sess.run(meta.outputs, feed)
    return time.perf_counter() - t


def bound_steps(sess: Any, meta: OrtDecoder, batch: int) -> float:
    """The same steps with IO binding: presents stay ORT-allocated and feed the next step."""
    import onnxruntime as ort

    zeros = np.zeros((batch, meta.kv_heads, PAST, meta.head_dim), np.float32)
    past = [ort.OrtValue.ortvalue_from_numpy(zeros) for _ in meta.past]
    t = time.perf_counter()
    for s in range(STEPS):
        n = PAST + s
        io = sess.io_binding()
        io.bind_cpu_input(INPUT_IDS, np.full((batch, 1), 5, np.int64))
        io.bind_cpu_input(ATTENTION_MASK, np.ones((batch, n + 1), np.int64))
        if meta.layout == LEFT:
            io.bind_cpu_input(POSITION_IDS, np.full((batch, 1), n, np.int64))
        for name, value in zip(meta.past, past, strict=True):
            io.bind_ortvalue_input(name, value)
        for name in meta.outputs:
            io.bind_output(name)
        sess.run_with_iobinding(io)
        outs = io.get_outputs()
        past = outs[1:]
        _ = outs[0].numpy()  # the logits are needed on the host every step
    return time.perf_counter() - t


def measure(
    candidates: dict[str, Callable[[int], float]],
    repeats: int,
    batches: Sequence[int] = BATCHES,
) -> dict[str, dict[str, float]]:
    """Median ms per decode step, per candidate and batch, over interleaved repeats."""
    times: dict[tuple[str, int], list[float]] = {}
    for fn in candidates.values():  # warm-up
        for b in batches:
            fn(b)
    for _ in range(repeats):
        for name, fn in candidates.items():
            for b in batches:
                times.setdefault((name, b), []).append(fn(b) / STEPS * 1000)
    return {
        name: {f"b{b}_ms": round(float(np.median(times[name, b])), 2) for b in batches}
        for name in candidates
    }


def quantize(src: Path, dst: Path, bits: int, block: int) -> None:
    """The export's quantization with ``bits`` and ``block`` (int8 compute)."""
    from tritonforge.tasks.generation.export.graph import quantize_weights_int8
    from tritonforge.tasks.generation.export.spec import WeightOnlyQuantization

    quantize_weights_int8(src, dst, WeightOnlyQuantization(bits=bits, block_size=block))


def gate(path: Path, report: dict[str, Any], tokenizer: Any, ppl_fp32: float) -> dict[str, Any]:
    """The export's int8 gate on ``path``: teacher-forced agreement with fp32's greedy tokens
    (the export report's reference) and perplexity ratio on the held-out passages."""
    from tritonforge.export.specs.smollm2 import smollm2_spec
    from tritonforge.export.specs.text_inputs import read_sentences
    from tritonforge.generation import render_prompt
    from tritonforge.tasks.generation.export import verify

    spec = smollm2_spec()
    meta = json.loads((path.parent / "generation.json").read_text())
    ref = report["fidelity"]["reference"]
    prompts = [
        tokenizer.encode(
            render_prompt(r["prompt"], meta["chat_template"], True), add_special_tokens=False
        ).ids
        for r in ref
    ]
    dec = OrtDecoder(path, intra_op_threads=2)
    agree = verify.teacher_forced_agreement(
        dec, dec.empty_past, prompts, [r["tokens"] for r in ref]
    )
    rows = [tokenizer.encode(t).ids for t in read_sentences(spec.perplexity_file)]
    ppl = verify.perplexity(dec, dec.empty_past, rows)
    g = spec.int8_gate
    return {
        "greedy_agreement": round(agree, 4),
        "perplexity": round(ppl, 3),
        "perplexity_ratio": round(ppl / ppl_fp32, 4),
        "passes": agree >= g.min_greedy_agreement and ppl / ppl_fp32 <= g.max_perplexity_ratio,
    }


SWEEP_BATCHES = (1, 4, 8, 16)
SWEEP_PAST = 72  # a ~40-token chat prompt plus ~32 generated tokens
PREFILL = (8, 40)  # rows x tokens: what 8 simultaneous arrivals prefill


def with_accuracy_level(src: Path, dst: Path, level: int) -> None:
    """``src``'s ``MatMulNBits`` graph with every node's ``accuracy_level`` set to ``level``
    (0: dequantize and compute in fp32; 4: quantize activations, int8 compute)."""
    import onnx

    model = onnx.load(str(src))
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            for a in node.attribute:
                if a.name == "accuracy_level":
                    a.i = level
    onnx.save(model, str(dst))


def sweep_step(dec: OrtDecoder, batch: int) -> float:
    """Seconds for :data:`STEPS` decode steps of ``batch`` rows from :data:`SWEEP_PAST`."""
    past = [np.zeros((batch, dec.kv_heads, SWEEP_PAST, dec.head_dim), np.float32)] * len(dec.past)
    t = time.perf_counter()
    for s in range(STEPS):
        n = SWEEP_PAST + s
        ids = np.full((batch, 1), 5 + s, np.int64)
        _, past = dec(
            ids, np.ones((batch, n + 1), np.int64), np.full((batch, 1), n, np.int64), past
        )
    return time.perf_counter() - t


def prefill_once(dec: OrtDecoder, _: int) -> float:
    """Seconds for one prefill of :data:`PREFILL` (rows, tokens), times :data:`STEPS` so that
    :func:`measure`'s per-step division leaves the prefill's own time."""
    rows, n = PREFILL
    ids = np.tile(np.arange(7, 7 + n, dtype=np.int64), (rows, 1))
    t = time.perf_counter()
    dec(
        ids,
        np.ones_like(ids),
        np.tile(np.arange(n, dtype=np.int64), (rows, 1)),
        dec.empty_past(rows),
    )
    return (time.perf_counter() - t) * STEPS


def sweep(args: argparse.Namespace) -> dict[str, Any]:
    """fp32 and the int8/int4 candidates: ms per decode step at :data:`SWEEP_BATCHES` rows and
    one prefill, interleaved repeats (medians), plus each candidate's gate."""
    from tokenizers import Tokenizer

    from tritonforge.pipelines import generator_from_repository

    group = generator_from_repository(args.model_repository)
    version = args.model_repository / group.model("int8") / "1"
    int8 = decoder_file(args.model_repository / group.model("int8"))
    fp32 = decoder_file(args.model_repository / group.model("fp32"))
    report = json.loads((version / "export_report.json").read_text())
    work = args.build_dir / "decoder-experiments"
    work.mkdir(parents=True, exist_ok=True)
    (work / "generation.json").write_text((version / "generation.json").read_text())
    variants: dict[str, Path] = {
        "fp32 (served)": fp32,
        "int8 block 32, int8 compute (served)": int8,
    }
    acc0 = work / "decoder_q8_b32_acc0.onnx"
    if not acc0.is_file():
        with_accuracy_level(int8, acc0, 0)
    variants["int8 block 32, fp32 compute"] = acc0
    for bits, block in args.sweep_quantize:
        dst = work / f"decoder_q{bits}_b{block}.onnx"
        if not dst.is_file():
            log.info("    quantizing %d bits, block %d", bits, block)
            t = time.perf_counter()
            quantize(fp32, dst, bits, block)
            log.info("    quantized in %.0f s", time.perf_counter() - t)
        variants[f"int{bits} block {block}, int8 compute"] = dst
    decoders = {name: OrtDecoder(path, intra_op_threads=2) for name, path in variants.items()}
    out: dict[str, Any] = {"load_average": os.getloadavg(), "past": SWEEP_PAST, "prefill": PREFILL}
    cands: dict[str, Callable[[int], float]] = {}
    for name, dec in decoders.items():
        cands[name] = functools.partial(sweep_step, dec)
    steps = measure(cands, args.repeats, SWEEP_BATCHES)
    prefills = measure(
        {name: functools.partial(prefill_once, dec) for name, dec in decoders.items()},
        args.repeats,
        (1,),
    )
    out["load_average_mid"] = os.getloadavg()
    gates = {}
    if not args.no_gate:
        tokenizer = Tokenizer.from_file(str(version / "tokenizer.json"))
        ppl32 = float(report["quantization"]["perplexity"]["fp32"])
        for name, path in variants.items():
            if not name.startswith("fp32"):
                gates[name] = gate(path, report, tokenizer, ppl32)
                log.info("    %s: %s", name, gates[name])
    out["variants"] = {
        name: {**steps[name], "prefill_ms": prefills[name]["b1_ms"], **gates.get(name, {})}
        for name in variants
    }
    out["load_average_end"] = os.getloadavg()
    return out


def decoder_file(model_dir: Path) -> Path:
    config = ModelConfig.from_pbtxt((model_dir / "config.pbtxt").read_text())
    return model_dir / "1" / config.param("decoder_file", kind=str)


SPIN = "session.intra_op.allow_spinning"


def parse_candidates(given: Sequence[str]) -> dict[str, dict[str, str]]:
    """``LABEL=KEY=VALUE[,KEY=VALUE]`` -> {label: {key: value}}; ValueError naming a malformed
    item."""
    out = {}
    for item in given:
        label, _, entries = item.partition("=")
        pairs = [e.split("=", 1) for e in entries.split(",") if e]
        if not label or not pairs or any(len(pair) != 2 for pair in pairs):
            raise ValueError(f"--candidates {item!r}: write LABEL=KEY=VALUE[,KEY=VALUE]")
        out[label] = dict(pairs)
    return out


def served_candidates(
    repo: Path,
    work: Path,
    rounds: int,
    max_tokens: int,
    candidates: dict[str, dict[str, str]],
    concurrency: Sequence[int] = (1, 8),
) -> dict[str, Any]:
    """The served int8 model as exported and with each candidate's session entries added to its
    config (e.g. ``session.intra_op.allow_spinning`` = 1), models of one temporary repository
    (hard links), interleaved rounds at each of ``concurrency`` streams."""
    import shutil

    from tritonforge.loadtest.bench.generate import client_stream, median_cells, run_cell
    from tritonforge.pipelines import generator_from_repository
    from tritonforge.runtime.launcher.settings import ServerSettings
    from tritonforge.runtime.serving import EmbeddedServer

    src = repo / generator_from_repository(repo).model("int8")
    tmp = work / "served-spinning"
    shutil.rmtree(tmp, ignore_errors=True)
    names = {"as exported": src.name} | {
        label: f"{src.name}_c{i}" for i, label in enumerate(candidates)
    }
    for label, name in names.items():
        shutil.copytree(
            src, tmp / name, copy_function=os.link, ignore=shutil.ignore_patterns("__pycache__")
        )
        config = tmp / name / "config.pbtxt"
        text = config.read_text().replace(f'name: "{src.name}"', f'name: "{name}"')
        for key, value in candidates.get(label, {}).items():
            text += f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
        config.unlink()  # a hard link: never write through it
        config.write_text(text)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(src / "1" / "tokenizer.json"))

    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False).ids)

    settings = ServerSettings.ephemeral(
        tmp, model_control_mode="explicit", load_models=list(names.values())
    )
    server = EmbeddedServer(settings)
    server.start()
    cells = []
    try:
        server.wait_ready()
        streams = {
            label: client_stream(server.grpc_url, "grpc", model=name)
            for label, name in names.items()
        }
        for stream in streams.values():
            for _ in stream("Hello", 4):
                pass
        for rnd in range(rounds):
            for label, stream in streams.items():
                for conc in concurrency:
                    per_client = 2 if conc == 1 else 1
                    cell = run_cell(label, stream, count, conc, per_client, max_tokens)
                    cell.round = rnd
                    log.info("    served %s x%d: %.1f tok/s", label, conc, cell.tokens_per_s)
                    cells.append(cell)
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        f"{c.target} x{c.concurrency}": {
            "tokens_per_s": round(c.tokens_per_s, 2),
            "itl_p50_ms": round(c.itl_p50_ms, 1),
            "ttft_p50_ms": round(c.ttft_p50_ms, 1),
            "itl_p99_ms": round(c.itl_p99_ms, 1),
        }
        for c in median_cells(cells)
    }


def _quantization(
    args: argparse.Namespace, version: Path, report: dict[str, Any], int8: Path, fp32: Path
) -> dict[str, Any]:
    """Bits x block size of the int8 decoder: each candidate's speed and gate figures."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(version / "tokenizer.json"))
    ppl32 = float(report["quantization"]["perplexity"]["fp32"])
    work = args.build_dir / "decoder-experiments"
    work.mkdir(parents=True, exist_ok=True)
    (work / "generation.json").write_text((version / "generation.json").read_text())
    variants = {"int8 block 32 (served)": int8}
    for bits, block in ((8, 128), (4, 32), (4, 128)):
        dst = work / f"decoder_q{bits}_b{block}.onnx"
        if not dst.is_file():
            log.info("    quantizing %d bits, block %d", bits, block)
            quantize(fp32, dst, bits, block)
        variants[f"int{bits} block {block}"] = dst
    gates = {}
    for name, path in variants.items():
        gates[name] = gate(path, report, tokenizer, ppl32)
        log.info("    %s: %s", name, gates[name])
    qs = {name: session(path) for name, path in variants.items()}
    qmeta = {name: OrtDecoder(path, intra_op_threads=1) for name, path in variants.items()}
    qcands: dict[str, Callable[[int], float]] = {
        name: functools.partial(numpy_steps, s, qmeta[name]) for name, s in qs.items()
    }
    return {name: {**speed, **gates[name]} for name, speed in measure(qcands, args.repeats).items()}


def _served(args: argparse.Namespace) -> int:
    out: dict[str, Any] = {"load_average": os.getloadavg()}
    out["served"] = served_candidates(
        args.model_repository,
        args.build_dir,
        args.repeats,
        args.max_tokens,
        args.candidates,
        args.concurrency,
    )
    out["load_average_end"] = os.getloadavg()
    (args.build_dir / "decoder_experiments_served.json").write_text(
        json.dumps(out, indent=2) + "\n"
    )
    print(json.dumps(out, indent=2))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tritonforge.tasks.generation.loadtest.decoder_experiments"
    )
    p.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    p.add_argument("--build-dir", type=Path, default=Path("build"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quantize", action="store_true", help="also bits x block size (+ gate)")
    p.add_argument("--served", action="store_true", help="only: served int8 vs --candidates")
    p.add_argument(
        "--candidates",
        nargs="*",
        default=[f"spinning on={SPIN}=1"],
        metavar="LABEL=KEY=VALUE[,KEY=VALUE]",
        help="--served: session entries added to the int8 model's config, one model per label",
    )
    p.add_argument("--concurrency", type=int, nargs="*", default=[1, 8], help="--served streams")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--sweep", action="store_true", help="only: step time vs batch, candidates")
    p.add_argument(
        "--sweep-quantize",
        type=lambda v: tuple(int(x) for x in v.split(":")),
        nargs="*",
        default=[(8, 128), (4, 32)],
        metavar="BITS:BLOCK",
        help="quantized candidates of --sweep beside the served ones (default 8:128 4:32)",
    )
    p.add_argument("--no-gate", action="store_true", help="--sweep without the gates")
    args = p.parse_args(argv)
    try:
        args.candidates = parse_candidates(args.candidates)
    except ValueError as e:
        p.error(str(e))
    if args.sweep:
        result = sweep(args)
        (args.build_dir / "decoder_sweep.json").write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        return 0
    if args.served:
        return _served(args)

    from tritonforge.pipelines import generator_from_repository

    group = generator_from_repository(args.model_repository)
    version = args.model_repository / group.model("int8") / "1"
    int8 = decoder_file(args.model_repository / group.model("int8"))
    fp32 = decoder_file(args.model_repository / group.model("fp32"))
    report = json.loads((version / "export_report.json").read_text())
    meta = OrtDecoder(int8, intra_op_threads=2)
    load = os.getloadavg()
    out = {"load_average": load, "past": PAST, "steps": STEPS}
    sessions = {
        "baseline (2 threads, spinning, ORT_ENABLE_ALL)": session(int8),
        "1 thread": session(int8, threads=1),
        "spinning off": session(int8, config={"session.intra_op.allow_spinning": "0"}),
        "ORT_ENABLE_EXTENDED": session(int8, opt="extended"),
        "ORT_ENABLE_BASIC": session(int8, opt="basic"),
        "session.use_env_allocators=1": session(int8, config={"session.use_env_allocators": "1"}),
    }
    candidates: dict[str, Callable[[int], float]] = {
        name: functools.partial(numpy_steps, s, meta) for name, s in sessions.items()
    }
    base = sessions["baseline (2 threads, spinning, ORT_ENABLE_ALL)"]
    candidates["IO binding (presents stay ORT values)"] = functools.partial(bound_steps, base, meta)
    log.info("==> session options + IO binding (load %.2f)", load[0])
    out["session"] = measure(candidates, args.repeats)
    if args.quantize:
        out["quantization"] = _quantization(args, version, report, int8, fp32)
    out["load_average_end"] = os.getloadavg()
    path = args.build_dir / "decoder_experiments.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
