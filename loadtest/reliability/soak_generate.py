"""``python -m tritonforge.loadtest.reliability.soak_generate``: RSS of the ``generate`` stub and tritonserver over
``--generations`` short streamed generations (default 2000, ``--concurrency`` gRPC streams).
Fails (exit 1) when a process grows by ``--max-growth-mb`` or more per 10k generations over the
second half of the run (the KV batch is rebuilt every step; a leak would be sustained).
Writes ``reports/soak_generate.json``."""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from tritonforge.client.generate import GenerateClient
from tritonforge.loadtest.reliability.soak import growth_per_10k, measure
from tritonforge.logs import run_main
from tritonforge.pipelines import generator_from_repository
from tritonforge.progress import Bar
from tritonforge.runtime.serving import EmbeddedServer, serving

log = logging.getLogger(__name__)
PROMPTS = ("Hi", "Name a fruit.", "What is 2 + 2?", "Say something kind about Mondays.")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tritonforge.loadtest.reliability.soak_generate", description=__doc__
    )
    p.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    p.add_argument("--generations", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--samples", type=int, default=20)
    p.add_argument("--max-growth-mb", type=float, default=50.0)
    p.add_argument("--out", type=Path, default=Path("reports/soak_generate.json"))
    return p


class Workers:
    """``concurrency`` threads sharing ``generations`` short generations; failures counted."""

    def __init__(self, client: GenerateClient, args: argparse.Namespace) -> None:
        self.client, self.args = client, args
        self.done = 0
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self.work, args=(k,)) for k in range(args.concurrency)
        ]

    def work(self, k: int) -> None:
        args = self.args
        i = k
        while True:
            with self.lock:
                if self.done >= args.generations:
                    return
                self.done += 1
            try:
                self.client.generate(
                    PROMPTS[i % len(PROMPTS)], stream=False, max_tokens=args.max_tokens
                )
            except Exception as e:  # counted; the soak goes on
                self.errors.append(f"{type(e).__name__}: {e}")
            i += args.concurrency

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def alive(self) -> bool:
        return any(t.is_alive() for t in self.threads)


def soak(
    server: EmbeddedServer, args: argparse.Namespace
) -> tuple[Workers, list[tuple[int, dict[str, float]]], float]:
    """Run the generations against ``server``, sampling RSS every ``generations / samples``; the
    workers, the RSS curve and the window in seconds."""
    workers = Workers(GenerateClient(server.grpc_url, protocol="grpc", timeout_s=60), args)
    curve: list[tuple[int, dict[str, float]]] = []
    t0 = time.monotonic()
    workers.start()
    step = max(1, args.generations // args.samples)
    next_sample = 0
    bar = Bar("soak generate", args.generations, unit="generations", leave=False)
    while workers.alive():
        bar.update_to(workers.done)
        if workers.done >= next_sample:
            curve.append((workers.done, measure(server)[0]))
            next_sample += step
            log.info(
                f"    {workers.done:>6} generations: "
                + ", ".join(f"{k} {v:.0f} MB" for k, v in curve[-1][1].items())
            )
        time.sleep(0.2)
    bar.close()
    curve.append((workers.done, measure(server)[0]))
    return workers, curve, time.monotonic() - t0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    default = generator_from_repository(args.model_repository).model()
    with serving(args.model_repository, model_control_mode="explicit", load_models=[default]) as s:
        workers, curve, window_s = soak(s, args)
    done, errors = [workers.done], workers.errors
    half = curve[len(curve) // 2 :]
    growth = {
        name: growth_per_10k([n for n, _ in half], [r[name] for _, r in half])
        for name in half[0][1]
    }
    breaches = [
        f"{k} grows {v:.1f} MB/10k >= {args.max_growth_mb}"
        for k, v in growth.items()
        if v >= args.max_growth_mb
    ]
    if errors:
        breaches.append(f"{len(errors)} generation(s) failed, e.g. {errors[0]}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "generations": done[0],
                "window_s": window_s,
                "curve": curve,
                "growth_mb_per_10k_second_half": growth,
                "breaches": breaches,
            },
            indent=2,
        )
        + "\n"
    )
    print(
        f"==> {done[0]} generations in {window_s:.0f} s; second-half growth (MB/10k): "
        + ", ".join(f"{k} {v:.1f}" for k, v in growth.items())
    )
    for b in breaches:
        print(f"  BREACH {b}")
    return 1 if breaches else 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
