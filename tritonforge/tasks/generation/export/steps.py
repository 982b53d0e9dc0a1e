"""A decoder's export (checkpoint: GGUF or Hugging Face directory -> PyTorch -> ONNX with KV cache -> verify -> int8 -> gate), plugged
into :mod:`export.flow` (fingerprint skip, staging + ``os.replace``, sidecars, report) for the
``generate`` models. Every fp32 verification failure is collected and raised as one
:class:`VerificationError`; the model repository is left untouched then. int8 failing its gate
is not fatal: int8 is left out, fp32 becomes the default (the spec's rule,
:meth:`GenerationServing.default_for`), and the log and the report say why.

Each served model's directory is built whole in the staging and replaces the repository's as a
unit; a model of this group the export no longer serves under that name (``generate_int8`` once
int8 became the default) is taken out in the same commit.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

import tritonforge
from tritonforge.decoder import OrtDecoder
from tritonforge.export import flow
from tritonforge.export.flow import Outcome, Progress, Steps
from tritonforge.export.pipeline_configs import stage_files
from tritonforge.export.spec import digest_json
from tritonforge.export.specs.text_inputs import read_sentences
from tritonforge.export.staging import Staging, library_versions, task_export_files
from tritonforge.export.step_bar import log_progress
from tritonforge.integrity import sha256_file
from tritonforge.tasks import generation
from tritonforge.tasks.generation.export import questions, verify
from tritonforge.tasks.generation.export.config import (
    DECODER_FILE,
    DEFAULT_RECORD,
    ROLES,
    VERSION,
    files,
    int8_served,
    models,
    render_config,
    stale_models,
)
from tritonforge.tasks.generation.export.families import (
    BUILDER_OPTIONS,
    check_architecture,
    family_of,
)
from tritonforge.tasks.generation.export.genai import build_graph, save_hf_checkpoint
from tritonforge.tasks.generation.export.graph import (
    check_graph,
    export_graph,
    quantize_weights_int8,
    step_latency_ms,
)
from tritonforge.tasks.generation.export.load import checkpoint_files, load_checkpoint, package_file
from tritonforge.tasks.generation.export.module import KVCacheDecoder
from tritonforge.tasks.generation.export.report import render_markdown
from tritonforge.tasks.generation.export.spec import DecoderSpec, WeightOnlyQuantization

log = logging.getLogger(__name__)

TIE_MARGIN = 1e-2  # a greedy divergence where PyTorch's own top-2 logits are closer is a tie


# Paths inside the tritonforge namespace, unresolved: the same names in a checkout (where
# tritonforge/export links to export/) and in an installed wheel (site-packages/tritonforge/...).
NAMESPACE = Path(tritonforge.__file__).parent
# The code this export runs (its own package, the shared flow, staging and report helpers it
# imports, and the serving scheduler its fidelity check drives); other exporters' changes do not
# re-export it.
CODE = (
    # the task's own export code is staging.task_export_files(generation.NAME), added by code_digest
    *(s for s in generation.EXPORT_SOURCES if not s.startswith("tasks/")),
    "export/specs/text_inputs.py",
    "export/flow.py",
    "export/report.py",
    "export/staging.py",
    "export/step_bar.py",
    "export/onnx_export.py",
    "export/errors.py",
    "generation.py",
    # generation.py's parts (the verification decodes through the served scheduler)
    "sampling.py",
    "scheduler.py",
    "scheduler_prefill.py",
    "prefill_plan.py",
    "kv_batch.py",
    "text_stream.py",
    "decoder.py",
    # the config layer renders generate's config.pbtxt
    "configschema.py",
    "modelconfig.py",
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
    for rel, path in task_export_files(generation.NAME):  # never its routes, tools, load tests
        h.update(rel.encode())
        h.update(path.read_bytes())
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
    """Every input of the decoder's export; equal digests mean an identical export."""
    libs = {**library_versions(), "transformers": importlib.metadata.version("transformers")}
    if spec.graph is not None:
        libs["onnxruntime-genai"] = importlib.metadata.version("onnxruntime-genai")
    parts = {
        "code": code_digest(),
        "spec": digest_json(spec.fingerprint_data()),
        "sources": {
            p.name: sha256_file(p) for p in (*checkpoint_files(checkpoint), *spec.source_files)
        },
        "libraries": libs,
        "options": {"int8": int8},
    }
    return {"digest": digest_json(parts), **parts}


def run_decoder_export(
    spec: DecoderSpec,
    repo: Path,
    int8: bool,
    force: bool = False,
    progress: Progress = log_progress,
) -> Outcome:
    """Export ``spec``'s ``generate`` models into ``repo`` (fp32, and int8 when asked and
    through its gate). Up to date when the files of the last export's outcome are."""
    checkpoint = spec.source or package_file(spec.package, spec.checkpoint)
    task = flow.Task(
        name=spec.name,
        planned=files(spec, int8_served(spec, repo, int8)),
        fingerprint=partial(fingerprint, spec, checkpoint, int8),
        build=lambda staging, steps, fp: _DecoderBuild(spec, staging, steps, fp, int8).run(
            checkpoint
        ),
    )
    return flow.run_flow(task, repo, force, progress, bar=False)


class _DecoderBuild:
    """The decoder's steps over one staging; ``failures`` collects every verification failure."""

    def __init__(
        self, spec: DecoderSpec, staging: Staging, steps: Steps, fp: dict[str, Any], int8: bool
    ) -> None:
        self.spec, self.staging, self.steps, self.fp, self.int8 = spec, staging, steps, fp, int8
        # Built in the staging's scratch space (never committed), placed under the served
        # names once the int8 gate has decided them (:meth:`_place`).
        self.out = {r: staging.path(f".work/fp32/{name}") for r, name in ROLES.items()}
        if int8:
            self.out["int8"] = staging.path(f".work/int8/{DECODER_FILE}")
        self.paths: dict[str, Path] = {}
        self.failures: list[str] = []
        # read now: a malformed file fails before the long steps
        self.asked = (
            questions.read_questions(spec.questions_file) if spec.questions_file.name else []
        )
        self.report: dict[str, Any] = {
            **flow.report_header(spec.name, spec.description, fp, fp["libraries"], spec.opset),
            "grid": {"shapes": [list(g) for g in spec.grid], "padded": list(spec.padded_batches)},
            "parity": {},
            "artifacts": {},
        }

    def run(self, checkpoint: Path) -> dict[str, Any]:
        spec, steps, out = self.spec, self.steps, self.out
        torch.manual_seed(0)
        with steps("load checkpoint (transformers, float32; a GGUF dequantized)"):
            model, hf_tok = load_checkpoint(checkpoint)
            family = family_of(model.config, checkpoint)
            check_architecture(model, family, checkpoint)
            decoder = KVCacheDecoder(model).eval()
        self.report["family"] = self.family = family
        self.report["graph_builder"] = spec.graph.describe() if spec.graph else "torch.onnx"
        if spec.graph is None:
            with steps("ONNX export (KV cache, dynamic batch/sequence/past/total axes)"):
                export_graph(decoder, spec, out["decoder"])
        else:
            with steps(f"ONNX graph: {spec.graph.describe()}"):
                self.hf_dir = save_hf_checkpoint(model, hf_tok, self.staging.path(".work/hf"))
                self._genai(out["decoder"], None)
        fp32 = OrtDecoder(out["decoder"], intra_op_threads=2)
        self.layout = fp32.layout
        checker = spec.graph is None
        problems = check_graph(out["decoder"], decoder.layers, fp32.layout, checker)
        self.report["graph_checks"] = problems
        self.report["cache_layout"] = fp32.layout
        flow.check(problems, spec.name)
        with steps("tokenizer.json + generation.json"):
            meta = self._tokenizer_files(model, hf_tok)
        with steps("ONNX Runtime vs PyTorch logits on the grid (prefill, cached steps, padding)"):
            vocab = int(model.config.vocab_size)
            summary, problems = verify.check_grid(
                spec, fp32, fp32.empty_past, model, vocab, fp32.layout
            )
            self.report["parity"]["fp32"] = summary
            self.failures += problems
            steps.note(f"{summary['cases']} cases, worst {summary['worst']}")
        with steps(
            f"fidelity: {spec.fidelity_prompts} prompts x {spec.fidelity_new_tokens} tokens"
        ):
            alone, run = self._fidelity(model, hf_tok, meta, fp32)
        self.report["latency_ms"] = {
            "fp32_decode_b1_past64": step_latency_ms(fp32, 1, 64),
            "fp32_decode_b16_past64": step_latency_ms(fp32, 16, 64),
        }
        flow.check(self.failures, spec.name)
        task = (
            self.asked,
            questions.prompt_ids(run["tokenizer"], [q.text for q in self.asked], meta),
        )
        refused = (
            _int8(spec, out, (fp32, alone, run), task, self.report, steps, self._int8)
            if self.int8
            else []
        )
        served = self._default(refused)
        with steps("config.pbtxt per variant, sha256 sidecars, reports"):
            self._place(served)
            dirs = [self.staging.path(f"{m}/{VERSION}") for m in models(spec, served).values()]
            flow.seal(self.staging, steps, self.report, self.paths, dirs, render_markdown)
        return self.report

    def _default(self, refused: list[str]) -> bool:
        """Record (report, log) which variant is the default and why; returns whether int8 is
        served. fp32 passed its checks already (or nothing is committed)."""
        spec, served = self.spec, self.int8 and not refused
        names = models(spec, served)
        default = spec.serving.default_for(tuple(names))
        why = f"{default} is the default, served as {names[default]!r}"
        if refused:
            why += f"; int8 is not served, it failed its gate: {'; '.join(refused)}"
            log.warning("export %s: %s", spec.name, why)
        self.steps.note(why)
        self.report[DEFAULT_RECORD] = {
            "variant": default,
            "models": names,
            "int8_refused": refused,
            "reason": why,
        }
        return served

    def _genai(self, dst: Path, int8: WeightOnlyQuantization | None) -> None:
        """The GenAI builder's graph (fp32, or ``int8``) from the saved checkpoint into ``dst``."""
        graph = self.spec.graph
        assert graph is not None
        options = (*BUILDER_OPTIONS.get(self.family, ()), *graph.extra_options)
        work = self.staging.path(".work/genai")
        build_graph(self.hf_dir, dst, replace(graph, extra_options=options), int8, work)

    def _int8(self) -> None:
        """The int8 decoder as the spec declares: the builder's, or the fp32 graph quantized."""
        if self.spec.graph is None:
            quantize_weights_int8(self.out["decoder"], self.out["int8"], self.spec.int8_method)
        else:
            self._genai(self.out["int8"], self.spec.int8_method)

    def _tokenizer_files(self, model: Any, hf_tok: Any) -> dict[str, Any]:
        """fp32's tokenizer.json and generation.json; returns the generation metadata."""
        hf_tok.backend_tokenizer.save(str(self.out["tokenizer"]))
        cfg = model.config
        eos, bos = cfg.eos_token_id, cfg.bos_token_id
        added = hf_tok("x")["input_ids"]  # does the tokenizer put bos first in a prompt?
        meta = {
            "chat_template": hf_tok.chat_template,  # None: completions only
            "eos_token_ids": eos if isinstance(eos, list) else [eos],
            "bos_token_id": bos,
            "prompt_bos_token_id": bos if bos is not None and added[:1] == [bos] else None,
            "context_length": int(cfg.max_position_embeddings),
            "model_type": cfg.model_type,
            "source": self.spec.origin(),
        }
        self.out["generation"].write_text(json.dumps(meta, indent=2) + "\n")
        return meta

    def _fidelity(
        self, model: Any, hf_tok: Any, meta: dict[str, Any], fp32: OrtDecoder
    ) -> tuple[list[list[int]], dict[str, Any]]:
        """The served scheduler's greedy tokens (alone and batched) vs PyTorch generate; returns
        the tokens alone and the run's arguments (reused by the int8 gate)."""
        from tokenizers import Tokenizer

        spec, fp = self.spec, self.fp
        tok = Tokenizer.from_file(str(self.out["tokenizer"]))
        texts = read_sentences(spec.prompts_file)[: spec.fidelity_prompts]
        template = meta["chat_template"]
        prompts = questions.prompt_ids(tok, texts, meta)
        # transformers' own prompt: the chat template's, or the tokenizer's (completions)
        if prompts != [_chat_ids(hf_tok, t) if template else hf_tok(t)["input_ids"] for t in texts]:
            what = "apply_chat_template" if template else "the tokenizer (special tokens added)"
            self.failures.append(f"prompts: served prompt tokens differ from {what}")
        key = {"sources": fp["sources"], "libraries": fp["libraries"]}
        reference = cached_reference(model, prompts, spec.fidelity_new_tokens, key)
        run = {
            "tokenizer": tok,
            "prompts": prompts,
            "new_tokens": spec.fidelity_new_tokens,
            "eos_ids": meta["eos_token_ids"],
            "name": models(spec, self.int8)["fp32"],
            "layout": self.layout,
            "kv_headroom": fp32.kv_headroom,  # the served batch's (in-place decode steps)
        }
        alone = verify.scheduler_tokens(fp32, fp32.empty_past, max_running=1, **run)
        batched = verify.scheduler_tokens(fp32, fp32.empty_past, max_running=8, **run)
        summary, problems = verify.fidelity(reference, alone, batched, TIE_MARGIN)
        # The served-parity integration test checks the model's greedy output against these.
        summary["reference"] = [
            {"prompt": t, "tokens": r[0]} for t, r in zip(texts, reference, strict=True)
        ]
        self.report["fidelity"] = summary
        self.failures += problems
        self.steps.note(
            f"{summary['identical']}/{summary['prompts']} identical to PyTorch generate; "
            f"divergences {summary['divergences']}; in-batch differences "
            f"{len(summary['batching_invariance_differences'])}"
        )
        return alone, run

    def _place(self, int8: bool) -> None:
        """Every served variant's whole model directory (config.pbtxt, model.py, its decoder
        and fp32's tokenizer files) under its served name; the group's models no longer served
        under theirs are removed by the same commit."""
        spec, staging = self.spec, self.staging
        served = models(spec, int8)
        for variant, model in served.items():
            staging.whole_dir(model)
            staging.path(f"{model}/config.pbtxt").write_text(render_config(spec, variant, int8))
            for rel, content in stage_files(model, "generate").items():
                staging.path(rel).write_bytes(content)
        self.paths = {label: staging.path(rel) for label, rel in files(spec, int8).items()}
        for variant in served:
            for role in ROLES:
                dst = self.paths[f"{variant}.{role}"]
                if role == "decoder":
                    os.replace(self.out[variant if variant != "fp32" else "decoder"], dst)
                else:
                    shutil.copyfile(self.out[role], dst)
        for stale in stale_models(spec, staging.repo, served.values()):
            self.steps.note(f"removing {stale!r}: no longer a served name of this group")
            staging.remove_dir(stale)


def _chat_ids(hf_tok: Any, text: str) -> list[int]:
    """``text``'s prompt tokens as transformers' ``apply_chat_template`` makes them."""
    return list(
        hf_tok.apply_chat_template(
            [{"role": "user", "content": text}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
    )


def _int8(
    spec: DecoderSpec,
    out: dict[str, Path],
    reference: tuple[OrtDecoder, list[list[int]], dict[str, Any]],
    task: tuple[list[questions.Question], list[list[int]]],
    report: dict[str, Any],
    steps: Steps,
    make_int8: Callable[[], None],
) -> list[str]:
    """``make_int8`` writes ``out["int8"]`` (the spec's graph builder and ``int8_method``);
    ``reference``: fp32's decoder, its greedy tokens alone and the fidelity run's arguments;
    ``task``: the spec's factual questions and their prompt tokens."""
    gate = spec.int8_gate
    fp32, alone, run = reference
    with steps(f"int8 weight-only quantization ({spec.int8_method.describe()})"):
        make_int8()
        problems = check_graph(out["int8"], fp32.layers, fp32.layout, spec.graph is None)
    q8 = OrtDecoder(out["int8"], intra_op_threads=2)
    if q8.layout != fp32.layout:
        problems.append(f"int8 graph's cache layout {q8.layout} differs from fp32's")
    with steps("int8 gate: greedy agreement with fp32 + held-out perplexity"):
        agree = verify.teacher_forced_agreement(q8, q8.empty_past, run["prompts"], alone)
        run8 = {**run, "name": models(spec, True)["int8"]}
        tokens8 = verify.scheduler_tokens(q8, q8.empty_past, max_running=8, **run8)
        alone8 = verify.scheduler_tokens(q8, q8.empty_past, max_running=1, **run8)
        free = verify.agreement(alone, tokens8)
        # Alone vs in a batch of 8: the same tokens (fp32's check is verify.fidelity's). Before
        # the scheduler kept each row's padding a multiple of kv_batch.PAD_ALIGN and right-padded
        # prefills, 7-10 of 20 prompts differed here (docs/performance.md).
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
        problems.append(f"int8 batching invariance: prompts {batch_diff} differ inside a batch")
    with steps(f"int8 gate: {len(task[0])} factual questions, fp32 and int8"):
        right32 = questions.right_answers(fp32, fp32.empty_past, *task, run)
        right8 = questions.right_answers(q8, q8.empty_past, *task, run)
        steps.note(f"right: fp32 {sum(right32)}, int8 {sum(right8)} of {len(right8)}")
    lost = questions.task_problem(right32, right8, gate.max_task_answers_lost)
    problems += [lost] if lost else []
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
        "method": spec.int8_method.describe(),
        "greedy_agreement": agree,
        "free_running_agreement": free,
        # The served int8 model's greedy output is checked against these (integration test).
        "greedy_tokens": alone8,
        "batching_invariance_differences": batch_diff,
        "perplexity": {"fp32": ppl32, "int8": ppl8, "ratio": ppl8 / ppl32},
        "factual_questions": {"questions": len(right8), "fp32": sum(right32), "int8": sum(right8)},
        "gate": {
            "min_greedy_agreement": gate.min_greedy_agreement,
            "max_perplexity_ratio": gate.max_perplexity_ratio,
            "max_task_answers_lost": gate.max_task_answers_lost,
        },
        "held_out_passages": len(rows),
        "problems": problems,
    }
    return problems
