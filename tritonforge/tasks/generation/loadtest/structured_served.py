"""Per-token cost of each ``/v1`` structured feature, served (docs/structured.md): the generate
model alone on the embedded Triton (a temporary repository linking it), one request at a time
through the front, milliseconds per completion token for each feature, rounds interleaved so
that a busy machine's drift spreads over all of them.

``python -m tritonforge.tasks.generation.loadtest.structured_served [--model generate]
[--rounds 5] [--max-tokens 32]``"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

from tritonforge.runtime.launcher.settings import ServerSettings
from tritonforge.runtime.serving import EmbeddedServer

PROMPT = "Describe a person as JSON with a name, an age and some hobbies."
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 16}},
    },
    "required": ["name", "age", "hobbies"],
    "additionalProperties": False,
}
TOOL = {
    "type": "function",
    "function": {"name": "save_person", "parameters": SCHEMA},
}
# feature -> the body fields it adds (greedy everywhere)
FEATURES: dict[str, dict[str, Any]] = {
    "none (today's path)": {},
    "logit_bias (10 tokens)": {"logit_bias": {str(i): -5 for i in range(1000, 1010)}},
    "presence + frequency penalties": {"presence_penalty": 0.5, "frequency_penalty": 0.5},
    "logprobs": {"logprobs": True},
    "logprobs, top_logprobs 20": {"logprobs": True, "top_logprobs": 20},
    "response_format json_schema": {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": SCHEMA},
        }
    },
    "tools, tool_choice required": {"tools": [TOOL], "tool_choice": "required"},
    "n=4 (per choice token)": {"n": 4},
}


def _one(url: str, model: str, extra: dict[str, Any], max_tokens: int) -> tuple[float, int]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }
    t0 = time.perf_counter()
    r = requests.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    elapsed = time.perf_counter() - t0
    r.raise_for_status()
    return elapsed, int(r.json()["usage"]["completion_tokens"])


def measure(
    url: str, model: str, rounds: int, max_tokens: int
) -> dict[str, list[tuple[float, int]]]:
    """(ms per completion token, completion tokens) of each feature, one pair per round."""
    for extra in FEATURES.values():  # warm: the grammar's tokenizer view, the caches
        _one(url, model, extra, 4)
    out: dict[str, list[tuple[float, int]]] = {name: [] for name in FEATURES}
    for _ in range(rounds):
        for name, extra in FEATURES.items():
            seconds, tokens = _one(url, model, extra, max_tokens)
            out[name].append((1000 * seconds / max(tokens, 1), tokens))
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    p.add_argument("--model", default="generate")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=32)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        os.symlink((args.model_repository / args.model).resolve(), repo / args.model)
        with EmbeddedServer(ServerSettings.ephemeral(repo)) as server:
            url = f"http://{server.http_url}"
            results = measure(url, args.model, args.rounds, args.max_tokens)
    base = statistics.median(ms for ms, _ in results["none (today's path)"])
    print(f"load average {os.getloadavg()[0]:.1f}; {args.rounds} rounds, {args.max_tokens} tokens")
    print("| feature | ms / token (median) | vs none | completion tokens |\n|---|---|---|---|")
    for name, pairs in results.items():
        median = statistics.median(ms for ms, _ in pairs)
        tokens = statistics.median(n for _, n in pairs)
        print(f"| {name} | {median:.1f} | {median / base:.2f}x | {tokens:g} |")
    print(json.dumps({k: [round(ms, 2) for ms, _ in v] for k, v in results.items()}))


if __name__ == "__main__":
    main()
