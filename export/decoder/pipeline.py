"""Decoder export: GGUF -> PyTorch -> ONNX with KV cache -> verify -> int8 -> gate -> commit.

Mirrors :mod:`export.pipeline` (fingerprint skip, staging + ``os.replace``, sidecars, report)
for the ``generate`` model. Every verification failure is collected and raised as one
:class:`VerificationError`; the model repository is left untouched then.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import importlib.metadata
import io
import json
import os
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

import tritonforge
from tritonforge.decoder import OrtDecoder, past_names, present_names
from tritonforge.export.decoder import verify
from tritonforge.export.decoder.config import VERSION, files, models, render_config
from tritonforge.export.decoder.load import load_gguf, package_file
from tritonforge.export.decoder.module import KVCacheDecoder
from tritonforge.export.decoder.report import write_report
from tritonforge.export.decoder.spec import BATCH_AXIS, PAST_AXIS, SEQ_AXIS, TOTAL_AXIS, DecoderSpec
from tritonforge.export.errors import ExportError, VerificationError
from tritonforge.export.pipeline import Outcome, Progress, _Steps
from tritonforge.export.progress import log_progress
from tritonforge.export.repository import Staging, library_versions, up_to_date
from tritonforge.export.spec import digest_json
from tritonforge.export.specs.text import read_sentences
from tritonforge.generation import render_prompt
from tritonforge.integrity import sha256_file

# The int8 decoder lived beside fp32 in ``generate/1`` before each variant became a model.
LEGACY_FILES = ("decoder_int8.onnx",)
TIE_MARGIN = 1e-2  # a greedy divergence where PyTorch's own top-2 logits are closer is a tie


# Paths inside the tritonforge namespace, unresolved: the same names in a checkout (where
# tritonforge/export links to export/) and in an installed wheel (site-packages/tritonforge/...).
NAMESPACE = Path(tritonforge.__file__).parent
# The code this export runs (its own package, the shared staging/report helpers it imports, and
# the serving scheduler its fidelity check drives); other exporters' changes do not re-export it.
CODE = (
    "export/decoder",
    "export/specs/smollm2.py",
    "export/specs/text.py",
    "export/repository.py",
    "export/pipeline.py",
    "export/errors.py",
    "generation.py",
    "decoder.py",
)
# A checkout caches under its build/ (gitignored); an installed package under the user's cache.
_CHECKOUT = Path(__file__).resolve().parents[2]
REFERENCE_CACHE = (
    _CHECKOUT / "build" / "reference-cache"
    if (_CHECKOUT / "pyproject.toml").is_file()
    else Path.home() / ".cache" / "tritonforge" / "reference-cache"
)


def code_digest() -> str:
    """sha256 over :data:`CODE` (the same in a checkout and installed)."""
    h = hashlib.sha256()
    for rel in CODE:
        path = NAMESPACE / rel
        for f in (
            sorted(p for p in path.rglob("*") if p.suffix in (".py", ".txt"))
            if path.is_dir()
            else [path]
        ):
            h.update(str(f.relative_to(NAMESPACE)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def cached_reference(
    model: Any, prompts: list[list[int]], new_tokens: int, key_parts: dict[str, Any]
) -> list[tuple[list[int], list[np.ndarray]]]:
    """PyTorch ``generate`` references, cached under ``build/`` (gitignored) by everything they
    depend on: the checkpoint digest, prompt tokens, length and library versions."""
    key = digest_json({**key_parts, "prompts": prompts, "new_tokens": new_tokens})
    path = REFERENCE_CACHE / f"{key}.npz"
    if path.exists():
        data = np.load(path, allow_pickle=False)
        n = int(data["count"])
        return [(data[f"t{i}"].tolist(), list(data[f"l{i}"])) for i in range(n)]
    reference = verify.reference_generate(model, prompts, new_tokens)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {"count": np.array(len(reference))}
    for i, (tokens, logits) in enumerate(reference):
        arrays[f"t{i}"] = np.asarray(tokens, np.int64)
        arrays[f"l{i}"] = np.stack(logits)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, path)
    return reference


def fingerprint(spec: DecoderSpec, checkpoint: Path, int8: bool) -> dict[str, Any]:
    libs = {**library_versions(), "transformers": importlib.metadata.version("transformers")}
    parts = {
        "code": code_digest(),
        "spec": digest_json(spec.fingerprint_data()),
        "sources": {p.name: sha256_file(p) for p in (checkpoint, *spec.source_files)},
        "libraries": libs,
        "options": {"int8": int8},
    }
    return {"digest": digest_json(parts), **parts}


def export_graph(decoder: KVCacheDecoder, spec: DecoderSpec, path: Path) -> None:
    """torch.onnx export (TorchScript-based) with named dynamic axes on every tensor."""
    b, p, s = spec.trace_shape
    if min(spec.trace_shape) < 2:
        raise ExportError(f"spec {spec.name}: trace_shape {spec.trace_shape} needs every size >= 2")
    vocab = int(decoder.model.config.vocab_size)
    ids = torch.randint(3, vocab, (b, s))
    past = [
        torch.randn(b, decoder.kv_heads, p, decoder.head_dim) for _ in range(2 * decoder.layers)
    ]
    args = (ids, torch.ones(b, p + s, dtype=torch.long), torch.arange(p, p + s).repeat(b, 1), *past)
    pasts, presents = past_names(decoder.layers), present_names(decoder.layers)
    axes: dict[str, dict[int, str]] = {
        "input_ids": {0: BATCH_AXIS, 1: SEQ_AXIS},
        "attention_mask": {0: BATCH_AXIS, 1: TOTAL_AXIS},
        "position_ids": {0: BATCH_AXIS, 1: SEQ_AXIS},
        "logits": {0: BATCH_AXIS, 1: SEQ_AXIS},
    }
    axes.update({n: {0: BATCH_AXIS, 2: PAST_AXIS} for n in pasts})
    axes.update({n: {0: BATCH_AXIS, 2: TOTAL_AXIS} for n in presents})
    log = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(log), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                decoder,
                args,
                str(path),
                input_names=["input_ids", "attention_mask", "position_ids", *pasts],
                output_names=["logits", *presents],
                dynamic_axes=axes,
                opset_version=spec.opset,
                do_constant_folding=True,
                dynamo=False,
            )
    except Exception as e:
        raise ExportError(
            f"torch.onnx.export of {spec.name} failed: {type(e).__name__}: {e}\n"
            + log.getvalue()[-2000:]
        ) from e


def check_graph(path: Path, layers: int) -> list[str]:
    """onnx.checker plus the declared dynamic axes on inputs and outputs."""
    import onnx

    problems: list[str] = []
    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as e:
        problems.append(f"{path.name}: onnx.checker: {e}")
    model = onnx.load(str(path), load_external_data=False)
    want = {
        "input_ids": (BATCH_AXIS, SEQ_AXIS),
        "attention_mask": (BATCH_AXIS, TOTAL_AXIS),
        "position_ids": (BATCH_AXIS, SEQ_AXIS),
        "logits": (BATCH_AXIS, SEQ_AXIS, None),
    }
    want.update({n: (BATCH_AXIS, None, PAST_AXIS, None) for n in past_names(layers)})
    want.update({n: (BATCH_AXIS, None, TOTAL_AXIS, None) for n in present_names(layers)})
    seen = {v.name: v for v in (*model.graph.input, *model.graph.output)}
    for name, axes in want.items():
        if name not in seen:
            problems.append(f"{path.name}: tensor {name!r} is missing")
            continue
        dims = seen[name].type.tensor_type.shape.dim
        got = tuple(d.dim_param or None for d in dims)
        if len(got) != len(axes) or any(a and g != a for g, a in zip(got, axes, strict=False)):
            problems.append(f"{path.name}: {name} has axes {got}, expected {axes}")
    return problems


def quantize_int8(src: Path, dst: Path, block_size: int = 32) -> None:
    """Weight-only int8 (blockwise symmetric ``MatMulNBits``, bits=8) with int8 compute
    (accuracy_level 4). Measured here against dynamic MatMul quantization (``quantize_dynamic``,
    per-channel): dynamic was slower than fp32 per decode step and failed the perplexity gate
    (ratio 1.89; 1.06 with lm_head and down_proj left in fp32), see docs/performance.md."""
    import logging

    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    # The quantizer logs a line per node at INFO (thousands); keep warnings only.
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    quantizer = MatMulNBitsQuantizer(
        str(src), bits=8, block_size=block_size, is_symmetric=True, accuracy_level=4
    )
    quantizer.process()
    quantizer.model.save_model_to_file(str(dst), use_external_data_format=False)


def step_latency_ms(decoder: OrtDecoder, batch: int, past: int, repeats: int = 5) -> float:
    """Median time of one decode step (batch rows, ``past`` cached columns)."""
    cache = [np.zeros((batch, decoder.kv_heads, past, decoder.head_dim), np.float32)] * len(
        decoder.past
    )
    ids = np.full((batch, 1), 5, np.int64)
    mask = np.ones((batch, past + 1), np.int64)
    pos = np.full((batch, 1), past, np.int64)
    times = []
    for _ in range(repeats + 1):
        t = time.perf_counter()
        decoder(ids, mask, pos, cache)
        times.append(time.perf_counter() - t)
    return float(np.median(times[1:]) * 1000)


def run_decoder_export(
    spec: DecoderSpec,
    repo: Path,
    int8: bool,
    force: bool = False,
    progress: Progress = log_progress,
) -> Outcome:
    steps = _Steps(spec.name, progress)
    checkpoint = package_file(spec.package, spec.checkpoint)
    planned = files(spec, int8)
    with steps("fingerprint inputs"):
        fp = fingerprint(spec, checkpoint, int8)
    if not force:
        ok, reason = up_to_date(repo, planned.values(), fp["digest"])
        if ok:
            progress(f"==> [export {spec.name}] up to date ({reason}); nothing to do")
            return Outcome(skipped=True)
        steps.note(f"exporting: {reason}")
    staging = Staging(repo)
    try:
        report = _build(spec, staging, steps, fp, checkpoint, int8)
        with steps("commit (os.replace into the repository)"):
            moved = staging.commit()
            for model in models(spec, int8).values():
                for name in LEGACY_FILES:  # an earlier layout's files would still be served
                    for stale in (repo / model / str(VERSION)).glob(f"{name}*"):
                        stale.unlink()
        progress(f"==> [export {spec.name}] done in {time.perf_counter() - steps.t0:.1f} s")
        return Outcome(skipped=False, report=report, moved=moved)
    finally:
        staging.discard()


def _build(
    spec: DecoderSpec,
    staging: Staging,
    steps: _Steps,
    fp: dict[str, Any],
    checkpoint: Path,
    int8: bool,
) -> dict[str, Any]:
    torch.manual_seed(0)
    paths = {role: staging.path(rel) for role, rel in files(spec, int8).items()}
    # fp32's files are written first; every other variant's directory gets copies (its own
    # decoder comes from quantization).
    out = {role: paths[f"fp32.{role}"] for role in ("decoder", "tokenizer", "generation")}
    if int8:
        out["int8"] = paths["int8.decoder"]
    failures: list[str] = []
    report: dict[str, Any] = {
        "spec": spec.name,
        "description": spec.description,
        "created_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "fingerprint": fp,
        "libraries": fp["libraries"],
        "opset": spec.opset,
        "grid": {"shapes": [list(g) for g in spec.grid], "padded": list(spec.padded_batches)},
        "parity": {},
        "artifacts": {},
    }
    with steps("load GGUF checkpoint (transformers, dequantized to float32)"):
        model, hf_tok = load_gguf(checkpoint)
        decoder = KVCacheDecoder(model).eval()
        vocab = int(model.config.vocab_size)
    with steps("ONNX export (KV cache, dynamic batch/sequence/past/total axes)"):
        export_graph(decoder, spec, out["decoder"])
        problems = check_graph(out["decoder"], decoder.layers)
        report["graph_checks"] = problems
        if problems:
            raise VerificationError(problems, f"spec {spec.name}")
    with steps("tokenizer.json + generation.json"):
        hf_tok.backend_tokenizer.save(str(out["tokenizer"]))
        eos = model.config.eos_token_id
        meta = {
            "chat_template": hf_tok.chat_template,
            "eos_token_ids": eos if isinstance(eos, list) else [eos],
            "bos_token_id": model.config.bos_token_id,
            "context_length": int(model.config.max_position_embeddings),
            "source": f"{spec.package}/{spec.checkpoint}",
        }
        out["generation"].write_text(json.dumps(meta, indent=2) + "\n")
    fp32 = OrtDecoder(out["decoder"], intra_op_threads=2)
    with steps("ONNX Runtime vs PyTorch logits on the grid (prefill, cached steps, padding)"):
        summary, problems = verify.check_grid(spec, fp32, fp32.empty_past, model, vocab)
        report["parity"]["fp32"] = summary
        failures += problems
        steps.note(f"{summary['cases']} cases, worst {summary['worst']}")
    with steps(f"fidelity: {spec.fidelity_prompts} prompts x {spec.fidelity_new_tokens} tokens"):
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(out["tokenizer"]))
        texts = read_sentences(spec.prompts_file)[: spec.fidelity_prompts]
        prompts = [
            tok.encode(render_prompt(t, meta["chat_template"], True), add_special_tokens=False).ids
            for t in texts
        ]
        hf_ids = [
            list(
                hf_tok.apply_chat_template(
                    [{"role": "user", "content": t}],
                    add_generation_prompt=True,
                    tokenize=True,
                    return_dict=False,
                )
            )
            for t in texts
        ]
        if prompts != hf_ids:
            failures.append("chat template: served prompt tokens differ from apply_chat_template")
        key = {"sources": fp["sources"], "libraries": fp["libraries"]}
        reference = cached_reference(model, prompts, spec.fidelity_new_tokens, key)
        run = {
            "tokenizer": tok,
            "prompts": prompts,
            "new_tokens": spec.fidelity_new_tokens,
            "eos_ids": meta["eos_token_ids"],
        }
        alone = verify.scheduler_tokens(fp32, fp32.empty_past, max_running=1, **run)
        batched = verify.scheduler_tokens(fp32, fp32.empty_past, max_running=8, **run)
        summary, problems = verify.fidelity(reference, alone, batched, TIE_MARGIN)
        # The served-parity integration test checks the model's greedy output against these.
        summary["reference"] = [
            {"prompt": t, "tokens": r[0]} for t, r in zip(texts, reference, strict=True)
        ]
        report["fidelity"] = summary
        failures += problems
        steps.note(
            f"{summary['identical']}/{summary['prompts']} identical to PyTorch generate; "
            f"divergences {summary['divergences']}; in-batch differences "
            f"{len(summary['batching_invariance_differences'])}"
        )
    report["latency_ms"] = {
        "fp32_decode_b1_past64": step_latency_ms(fp32, 1, 64),
        "fp32_decode_b16_past64": step_latency_ms(fp32, 16, 64),
    }
    if int8:
        failures += _int8(spec, out, fp32, alone, run, report, steps)
    if failures:
        raise VerificationError(failures, f"spec {spec.name}")
    with steps("config.pbtxt per variant, sha256 sidecars, reports"):
        for variant, model in models(spec, int8).items():
            staging.path(f"{model}/config.pbtxt").write_text(render_config(spec, variant, int8))
            if variant != "fp32":
                for role in ("tokenizer", "generation"):
                    shutil.copyfile(out[role], paths[f"{variant}.{role}"])
        staging.seal()
        for role, path in paths.items():
            report["artifacts"][role] = {
                "file": str(path.relative_to(staging.root)),
                "bytes": path.stat().st_size,
                "sha256": sha256_file(path),
            }
        steps.timings["total"] = time.perf_counter() - steps.t0
        report["timings_s"] = {k: round(v, 3) for k, v in steps.timings.items()}
        for model in models(spec, int8).values():
            write_report(report, staging.path(f"{model}/{VERSION}"))
    return report


def _int8(
    spec: DecoderSpec,
    out: dict[str, Path],
    fp32: OrtDecoder,
    alone: list[list[int]],
    run: dict[str, Any],
    report: dict[str, Any],
    steps: _Steps,
) -> list[str]:
    gate = spec.int8_gate
    with steps("int8 weight-only quantization (MatMulNBits, 8 bits)"):
        quantize_int8(out["decoder"], out["int8"])
        problems = check_graph(out["int8"], fp32.layers)
    q8 = OrtDecoder(out["int8"], intra_op_threads=2)
    with steps("int8 gate: greedy agreement with fp32 + held-out perplexity"):
        agree = verify.teacher_forced_agreement(q8, q8.empty_past, run["prompts"], alone)
        tokens8 = verify.scheduler_tokens(q8, q8.empty_past, max_running=8, **run)
        alone8 = verify.scheduler_tokens(q8, q8.empty_past, max_running=1, **run)
        free = verify.agreement(alone, tokens8)
        # Recorded, not (yet) a failure: measured 2026-12-01, 7 of 20 prompts' greedy tokens
        # differ alone vs in a batch of 8 (ONNX Runtime's MatMulNBits kernels differ between one
        # row and several; fp32 is invariant). Issue 20 item 3 keeps it open.
        batch_diff = [i for i, (a, b) in enumerate(zip(alone8, tokens8, strict=True)) if a != b]
        rows = [run["tokenizer"].encode(t).ids for t in read_sentences(spec.perplexity_file)]
        ppl32 = verify.perplexity(fp32, fp32.empty_past, rows)
        ppl8 = verify.perplexity(q8, q8.empty_past, rows)
        steps.note(
            f"top-1 agreement on fp32's greedy tokens {agree:.3f} (free-running, to the first "
            f"divergence: {free:.3f}); perplexity fp32 {ppl32:.2f}, int8 {ppl8:.2f}"
        )
    if agree < gate.min_greedy_agreement:
        problems.append(
            f"int8 gate: top-1 agreement with fp32's greedy tokens {agree:.3f} < "
            f"{gate.min_greedy_agreement}"
        )
    if batch_diff:
        steps.note(f"int8 batching invariance: prompts {batch_diff} differ inside a batch")
    if ppl8 / ppl32 > gate.max_perplexity_ratio:
        problems.append(
            f"int8 gate: perplexity ratio {ppl8 / ppl32:.3f} > {gate.max_perplexity_ratio}"
        )
    report["latency_ms"].update(
        {
            "int8_decode_b1_past64": step_latency_ms(q8, 1, 64),
            "int8_decode_b16_past64": step_latency_ms(q8, 16, 64),
        }
    )
    report["quantization"] = {
        "method": "onnxruntime MatMulNBits: weight-only int8, blocks of 32, int8 compute",
        "greedy_agreement": agree,
        "free_running_agreement": free,
        # The served int8 model's greedy output is checked against these (integration test).
        "greedy_tokens": alone8,
        "batching_invariance_differences": batch_diff,
        "perplexity": {"fp32": ppl32, "int8": ppl8, "ratio": ppl8 / ppl32},
        "gate": {
            "min_greedy_agreement": gate.min_greedy_agreement,
            "max_perplexity_ratio": gate.max_perplexity_ratio,
        },
        "held_out_passages": len(rows),
        "problems": problems,
    }
    return problems
