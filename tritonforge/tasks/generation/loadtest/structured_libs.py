"""Grammar libraries measured side by side (docs/structured.md): for xgrammar, llguidance and
outlines-core, the tokenizer info built from the generate model's tokenizer.json, a JSON schema
compiled, then per token of a valid instance the mask computed, applied to a vocab-wide row of
logits and the token accepted; rounds interleaved so a busy machine slows each library alike.

``python -m tritonforge.tasks.generation.loadtest.structured_libs [--model-dir model_repository/generate/1]``"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"type": "string"}},
        "kind": {"enum": ["cat", "dog", "bird"]},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city", "zip"],
        },
    },
    "required": ["name", "age", "tags", "kind", "address"],
}
INSTANCE = {
    "name": "Ada Lovelace",
    "age": 36,
    "tags": ["math", "engines"],
    "kind": "cat",
    "address": {"city": "London", "zip": "W1"},
}

Timings = dict[str, list[float]]


def _hf_tokenizer(model_dir: Path) -> Any:
    """The model's tokenizer as transformers' (both libraries build from it), its eos the
    model's first stop token (generation.json)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    eos = json.loads((model_dir / "generation.json").read_text())["eos_token_ids"][0]
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=tok.id_to_token(eos))


def run_xgrammar(hf: Any, vocab: int, ids: list[int], out: Timings) -> None:
    import torch
    import xgrammar as xgr

    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(
        hf, vocab_size=vocab, stop_token_ids=[hf.eos_token_id]
    )
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    out["setup_ms"].append((time.perf_counter() - t0) * 1e3)
    t0 = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA))
    out["compile_ms"].append((time.perf_counter() - t0) * 1e3)
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    logits = torch.from_numpy(np.random.default_rng(0).standard_normal(vocab).astype(np.float32))
    for tok in ids:
        t0 = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask)
        t1 = time.perf_counter()
        xgr.apply_token_bitmask_inplace(logits, bitmask[0])
        t2 = time.perf_counter()
        assert matcher.accept_token(tok), f"xgrammar rejected token {tok}"
        t3 = time.perf_counter()
        out["mask_us"].append((t1 - t0) * 1e6)
        out["apply_us"].append((t2 - t1) * 1e6)
        out["accept_us"].append((t3 - t2) * 1e6)
    assert matcher.accept_token(hf.eos_token_id) and matcher.is_terminated()


def run_llguidance(hf: Any, vocab: int, ids: list[int], out: Timings) -> None:
    import llguidance
    import llguidance.hf
    import llguidance.numpy as lln

    t0 = time.perf_counter()
    tok = llguidance.hf.from_tokenizer(hf, n_vocab=vocab)
    out["setup_ms"].append((time.perf_counter() - t0) * 1e3)
    t0 = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        SCHEMA, defaults={"whitespace_flexible": True}
    )
    matcher = llguidance.LLMatcher(tok, grammar)
    out["compile_ms"].append((time.perf_counter() - t0) * 1e3)
    assert not matcher.is_error(), matcher.get_error()
    bitmask = lln.allocate_token_bitmask(1, vocab)
    logits = np.random.default_rng(0).standard_normal((1, vocab)).astype(np.float32)
    for t in ids:
        t0 = time.perf_counter()
        lln.fill_next_token_bitmask(matcher, bitmask, 0)
        t1 = time.perf_counter()
        lln.apply_token_bitmask_inplace(logits, bitmask)
        t2 = time.perf_counter()
        assert matcher.consume_token(t), f"llguidance rejected token {t}: {matcher.get_error()}"
        t3 = time.perf_counter()
        out["mask_us"].append((t1 - t0) * 1e6)
        out["apply_us"].append((t2 - t1) * 1e6)
        out["accept_us"].append((t3 - t2) * 1e6)
    assert matcher.is_accepting()


def run_outlines(hf: Any, vocab: int, ids: list[int], out: Timings) -> None:
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    t0 = time.perf_counter()
    from tritonforge.tasks.generation.structured.logprobs import token_bytes

    tokens: dict[bytes, list[int]] = {}  # outlines-core indexes the tokens' bytes
    for i in hf.get_vocab().values():
        if i != hf.eos_token_id and i < vocab:
            tokens.setdefault(token_bytes(hf.backend_tokenizer, i), []).append(i)
    vocabulary = Vocabulary(hf.eos_token_id, tokens)
    out["setup_ms"].append((time.perf_counter() - t0) * 1e3)
    t0 = time.perf_counter()
    index = Index(build_regex_from_schema(json.dumps(SCHEMA), r"[ ]?"), vocabulary)
    out["compile_ms"].append((time.perf_counter() - t0) * 1e3)
    guide = Guide(index)
    logits = np.random.default_rng(0).standard_normal(vocab).astype(np.float32)
    for t in ids:
        t0 = time.perf_counter()
        allowed = np.asarray(guide.get_tokens(), np.int64)
        t1 = time.perf_counter()
        masked = np.full_like(logits, -np.inf)
        masked[allowed] = logits[allowed]
        t2 = time.perf_counter()
        guide.advance(t)
        t3 = time.perf_counter()
        out["mask_us"].append((t1 - t0) * 1e6)
        out["apply_us"].append((t2 - t1) * 1e6)
        out["accept_us"].append((t3 - t2) * 1e6)
    assert guide.is_finished() or hf.eos_token_id in guide.get_tokens()


LIBS: dict[str, Callable[[Any, int, list[int], Timings], None]] = {
    "xgrammar": run_xgrammar,
    "llguidance": run_llguidance,
    "outlines-core": run_outlines,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-dir", type=Path, default=Path("model_repository/generate/1"))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    hf = _hf_tokenizer(args.model_dir)
    vocab = len(hf)
    ids = hf.encode(json.dumps(INSTANCE), add_special_tokens=False)
    results: dict[str, Timings] = {
        name: {k: [] for k in ("setup_ms", "compile_ms", "mask_us", "apply_us", "accept_us")}
        for name in LIBS
    }
    failed: dict[str, str] = {}
    for _ in range(args.rounds):
        for name, fn in LIBS.items():
            if name in failed:
                continue
            try:
                fn(hf, vocab, ids, results[name])
            except Exception as e:  # a library that cannot run here is reported, not fatal
                failed[name] = f"{type(e).__name__}: {e}"
    print(f"load average {os.getloadavg()}; {len(ids)} tokens per instance, vocab {vocab}")
    for name, t in results.items():
        if name in failed:
            print(f"{name}: FAILED {failed[name][:300]}")
            continue
        cells = ", ".join(
            f"{k} median {statistics.median(v):.1f} p90 {np.percentile(v, 90):.1f}"
            for k, v in t.items()
        )
        print(f"{name}: {cells}")


if __name__ == "__main__":
    main()
