"""What ``make bench`` measures: the targets (a served configuration and the generator that
loads it), the measured cells, and the plan built from the discovered pipelines."""

from __future__ import annotations

import argparse
import logging
import math
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from tritonforge import tasks
from tritonforge.client.discovery import choose, route
from tritonforge.client.errors import ClientError
from tritonforge.loadtest.discovered import pipelines
from tritonforge.pipelines import Pipeline

log = logging.getLogger(__name__)


GENERATORS = ("locust", "perf_analyzer")


OPENAI = "openai"  # a Locust "protocol": OpenAI's /v1/embeddings on the HTTP port (ensembles)


@dataclass(frozen=True)
class Target:
    """One served configuration to load, and the load generator that loads it."""

    system: str  # "triton" | "fastapi"
    protocol: str  # "http" | "grpc"
    pipeline: str = "-"  # the orchestration: "ensemble" | "bls"
    variant: str = "fp32"
    generator: str = "locust"  # "locust" | "perf_analyzer"
    name: str = ""  # the pipeline (discovered)
    model: str = ""
    parameters: tuple[tuple[str, str], ...] = ()
    task: str = tasks.default().name  # another task's cells: its bench module (task_bench)
    input_name: str = "text"  # the pipeline's text input (discovered)

    @property
    def label(self) -> str:
        gen = "pa" if self.generator == "perf_analyzer" else "locust"
        cell = task_bench(self.task)
        if cell is not None:
            if self.system == "fastapi":
                return f"{cell.FASTAPI_LABEL} {self.name}"
            return f"{self.name} {self.pipeline} {self.variant} {self.protocol}/{gen}"
        if self.system == "fastapi":
            return f"fastapi+torch http/{gen}"
        if self.protocol == OPENAI:
            return f"/v1/embeddings {self.variant} http/{gen}"
        return f"{self.pipeline} {self.variant} {self.protocol}/{gen}"


@dataclass
class Cell:
    """One measured (target, concurrency) run. ``status`` is "ok", or says what went wrong
    (a stalled or failed run is reported, never dropped)."""

    target: Target
    concurrency: int
    summary: dict[str, Any]
    exit_code: int
    status: str = "ok"
    generator_cpu_share: float = math.nan  # the generator's CPU time / (wall time x cores)
    server_stats: dict[str, dict[str, float]] = field(default_factory=dict)
    # Server CPU time per request (tritonserver + stubs + front): robust on a loaded machine, unlike
    # throughput; NaN against a server not started by the bench.
    server_cpu_ms_per_request: float = math.nan


EMPTY_SUMMARY: dict[str, Any] = {
    "requests": 0,
    "failures": 0,
    "sentences_per_s": math.nan,
    "p50_ms": math.nan,
    "p95_ms": math.nan,
    "p99_ms": math.nan,
}


def targets_from(args: argparse.Namespace, pipeline: Pipeline) -> list[Target]:
    """Triton targets: each orchestration x variant of ``pipeline`` (those it serves), over each
    generator's protocols (Locust, the FastAPI baselines' generator, and perf_analyzer, for
    embedding and classification alike: issue 20 item 2 measures both over gRPC)."""
    out = []
    generators = [("locust", args.locust_protocols), ("perf_analyzer", args.pa_protocols)]
    for generator, protocols in generators:
        for orchestration in args.pipelines:
            for variant in args.variants:
                try:
                    model, parameters = route(pipeline, orchestration, variant)
                except ClientError as e:
                    log.warning("   (%s: skipped)", e)
                    continue
                for protocol in protocols:
                    if protocol == OPENAI and (
                        generator != "locust"
                        or orchestration != "ensemble"
                        or not tasks.get(pipeline.task).openai_embeddings
                    ):
                        continue  # /v1 serves embedding ensembles only
                    out.append(
                        Target(
                            "triton",
                            protocol,
                            orchestration,
                            variant,
                            generator,
                            pipeline.name,
                            model,
                            tuple(parameters.items()),
                            pipeline.task,
                            pipeline.input,
                        )
                    )
    return out


def task_bench(task: str) -> ModuleType | None:
    """The bench cell of ``task`` measured beside the default task's (its folder's
    ``loadtest.BENCH`` module: baseline, in-process limit, ratio lines), or None."""
    loadtest = tasks.get(task).module("loadtest")
    name = getattr(loadtest, "BENCH", None)
    return tasks.get(task).module(f"loadtest.{name}") if name else None


def classify_pipelines(args: argparse.Namespace) -> list[Pipeline]:
    """Every pipeline of ``--model-repository`` (discovered) whose task has a bench cell of its
    own (:func:`task_bench`: the classifiers)."""
    found = pipelines(args.model_repository).values()
    return [p for p in found if task_bench(p.task) is not None]


def bench_pipeline(args: argparse.Namespace) -> Pipeline:
    """The embedding pipeline to measure (``--pipeline-name``, else the default), discovered from
    ``--model-repository`` (the served one, or a copy of a running server's)."""
    return choose(pipelines(args.model_repository), tasks.default().name, args.pipeline_name)
