"""Command line: ``python -m tritonforge.client embed|classify|similarity|health|pipelines``,
printing JSON on stdout. Model names, variants and labels are discovered from the server
(``--name`` picks a pipeline; default: the discovered default of the task; ``--route`` the
orchestration, ensemble or bls, whose old name ``--pipeline`` still works).

Examples::

    python -m tritonforge.client embed "hello world" "second text" --protocol grpc
    python -m tritonforge.client classify "what a great day" "the service was slow" --top-k 2
    python -m tritonforge.client pipelines
    python -m tritonforge.client similarity "a cat sat on the mat" "a kitten sits on a rug"
    python -m tritonforge.client health --url localhost:8000
    python -m tritonforge.client generate "What is the capital of France?" --stream --max-tokens 32
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from tritonforge import tasks
from tritonforge.client.core import SETTING_ARGS
from tritonforge.client.errors import ClientError
from tritonforge.client.settings import PROTOCOLS, ROUTES
from tritonforge.client.sync import EmbeddingClient

log = logging.getLogger(__name__)


def _common(p: argparse.ArgumentParser) -> None:
    """The flags every command shares; ``args.open_client(args)`` opens the client they name (a
    task's own command calls it: the task imports nothing of this module)."""
    p.set_defaults(open_client=open_client)
    p.add_argument("--protocol", choices=PROTOCOLS, help="default $TRITONFORGE_PROTOCOL or http")
    p.add_argument(
        "--url",
        help="host:port (default $TRITONFORGE_URL or localhost:8000 http / localhost:8001 grpc)",
    )
    p.add_argument(
        "--variant",
        help="default $TRITONFORGE_VARIANT or fp32 (the server's variants: `pipelines`)",
    )
    p.add_argument(
        "--route",
        "--pipeline",
        dest="route",
        choices=ROUTES,
        help="orchestration route (default $TRITONFORGE_PIPELINE or ensemble; "
        "--pipeline is its old name)",
    )
    p.add_argument(
        "--name",
        help="pipeline name (default $TRITONFORGE_PIPELINE_NAME, else the discovered default)",
    )
    p.add_argument(
        "--repository",
        help="discover from this model repository instead of the server's configs "
        "(default $TRITONFORGE_MODEL_REPOSITORY; the configs need $TRITONFORGE_ADMIN_KEY)",
    )
    p.add_argument("--timeout-s", type=float, help="per-request timeout (default 30)")
    p.add_argument("--max-attempts", type=int, help="attempts for transient failures (default 4)")
    p.add_argument("--deadline-s", type=float, help="overall retry deadline (default 60)")


def open_client(args: argparse.Namespace) -> EmbeddingClient:
    """A client from the flags named like its settings (unset ones: the environment's)."""
    return EmbeddingClient(**{k: getattr(args, k, None) for k in SETTING_ARGS})


def describe(c: EmbeddingClient, task: str | None = None) -> dict[str, Any]:
    """Where a command's answer came from: address, pipeline, route, variant, model."""
    s = c.settings
    pipeline, model, parameters = c.resolve(task or tasks.default().name, None, None, None)
    return {
        "url": s.address,
        "protocol": s.protocol,
        "name": pipeline.name,
        "route": s.route,
        "pipeline": s.route,  # the old key of "route"
        "variant": s.variant,
        "model": model,
        "parameters": parameters,
    }


def cmd_embed(args: argparse.Namespace) -> dict[str, Any]:
    with open_client(args) as c:
        vectors = c.embed(args.texts)
        return {
            **describe(c),
            "dim": int(vectors.shape[1]),
            "norms": [round(float(n), 6) for n in np.linalg.norm(vectors, axis=1)],
            "embeddings": [[round(float(x), args.decimals) for x in row] for row in vectors],
        }


def cmd_similarity(args: argparse.Namespace) -> dict[str, Any]:
    with open_client(args) as c:
        a, b = c.embed([args.a, args.b])
        cosine = float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))
        return {**describe(c), "a": args.a, "b": args.b, "cosine": round(cosine, 6)}


def cmd_health(args: argparse.Namespace) -> dict[str, Any]:
    with open_client(args) as c:
        ready = c.is_ready()
        out: dict[str, Any] = {"url": c.settings.address, "live": c.is_live(), "ready": ready}
        if ready:
            out.update(describe(c, args.task))
            out["model_ready"] = c.is_model_ready(task=args.task)
            out["metadata"] = c.metadata(task=args.task)
        return out


def cmd_pipelines(args: argparse.Namespace) -> dict[str, Any]:
    """Every discovered pipeline: task, models per variant, BLS, output dims, labels, limits."""
    with open_client(args) as c:
        return {
            "url": c.settings.address,
            "pipelines": {
                name: {
                    "task": p.task,
                    "ensembles": dict(p.ensembles),
                    "bls": p.bls,
                    "bls_variants": list(p.bls_variants),
                    "input": p.input,
                    "outputs": {o.name: [o.datatype, list(o.dims)] for o in p.outputs},
                    "labels": list(p.labels),
                    "max_items": p.max_items,
                    "max_text_bytes": p.max_text_bytes,
                }
                for name, p in c.pipelines().items()
            },
        }


def cmd_generate(args: argparse.Namespace) -> dict[str, Any] | None:
    """Streamed: print chunks as they arrive (then a newline); otherwise JSON."""
    from tritonforge.client.generate import GenerateClient

    sampling = {
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "seed": args.seed,
        "stop": args.stop or None,
        "chat_template": False if args.no_chat_template else None,
    }
    c = GenerateClient(
        args.url, args.protocol, model=args.model, timeout_s=args.timeout_s, variant=args.variant
    )
    if args.stream:
        for chunk in c.generate(args.prompt, stream=True, **sampling):
            print(chunk, end="", flush=True)
        print()
        return None
    text = c.generate(args.prompt, stream=False, **sampling)
    return {"model": c.model, "text": text, "finish_reason": c.last_finish_reason}


def _generate_parser(sub: Any) -> None:
    gen = sub.add_parser("generate", help="generate text (streamed with --stream)")
    gen.add_argument("prompt")
    gen.add_argument("--stream", action="store_true", help="print tokens as they arrive")
    gen.add_argument("--max-tokens", type=int, help="new tokens at most (server default)")
    gen.add_argument("--temperature", type=float, help="0 = greedy (the default)")
    gen.add_argument("--top-p", type=float)
    gen.add_argument("--top-k", type=int)
    gen.add_argument("--seed", type=int, help="reproducible sampling")
    gen.add_argument("--stop", action="append", help="stop string (repeatable)")
    gen.add_argument("--no-chat-template", action="store_true", help="send the prompt raw")
    gen.add_argument("--model", default="generate", help="the model (group) to call")
    gen.add_argument(
        "--variant", help="pin the decoder variant (fp32, int8): its model is discovered"
    )
    gen.add_argument("--protocol", choices=PROTOCOLS, help="default $TRITONFORGE_PROTOCOL or http")
    gen.add_argument("--url", help="host:port (default $TRITONFORGE_URL or localhost:8000/8001)")
    gen.add_argument("--timeout-s", type=float, help="max seconds between chunks (default 30)")
    gen.set_defaults(func=cmd_generate)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tritonforge.client",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    embed = sub.add_parser("embed", help="embed texts; prints JSON with one vector per text")
    embed.add_argument("texts", nargs="+")
    embed.add_argument("--decimals", type=int, default=6, help="rounding of the printed vectors")
    _common(embed)
    embed.set_defaults(func=cmd_embed)
    sim = sub.add_parser("similarity", help="cosine similarity of two texts")
    sim.add_argument("a")
    sim.add_argument("b")
    _common(sim)
    sim.set_defaults(func=cmd_similarity)
    health = sub.add_parser("health", help="liveness, readiness and model metadata")
    health.add_argument(
        "--task",
        choices=tasks.names(tasks.PIPELINE),
        default=tasks.default().name,
        help="whose default pipeline to check",
    )
    _common(health)
    health.set_defaults(func=cmd_health)
    pipes = sub.add_parser("pipelines", help="the pipelines the server serves (discovered)")
    _common(pipes)
    pipes.set_defaults(func=cmd_pipelines)
    _generate_parser(sub)
    for task in tasks.registry().values():  # a task's own commands (its client's add_parser)
        client = task.module("client") if (task.folder / "client.py").is_file() else None
        if client is not None and hasattr(client, "add_parser"):
            client.add_parser(sub, _common)
    args = parser.parse_args(argv)
    try:
        result = args.func(args)
        if result is None:  # streamed output was printed as it arrived
            return 0
        print(json.dumps(result, indent=None if args.command == "embed" else 2))
    except ClientError as e:
        log.error("%s: %s", type(e).__name__, e)
        return 1
    # health: exit status 1 unless the server is ready (usable from scripts and probes)
    return 1 if args.command == "health" and not result["ready"] else 0
