"""What ``make bench`` measures: the targets (a served configuration and the generator that
loads it), the measured cells, and the plan built from the discovered pipelines."""

from __future__ import annotations

import argparse
import logging
import math
from dataclasses import dataclass, field
from typing import Any

from tritonforge import tasks
from tritonforge.client.discovery import choose, route
from tritonforge.client.errors import ClientError
from tritonforge.loadtest.bench import classify as classify_bench
from tritonforge.loadtest.discovered import pipelines
from tritonforge.pipelines import Pipeline

log = logging.getLogger(__name__)


GENERATORS = ("locust", "perf_analyzer")


OPENAI = "openai"  # a Locust "protocol": OpenAI's /v1/embeddings on the HTTP port (ensembles)


LOCUST_USERS = {"http": "TritonHttpUser", "grpc": "TritonGrpcUser", OPENAI: "OpenAIEmbeddingsUser"}


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
    task: str = tasks.default().name  # classification: loadtest.bench.classify
    input_name: str = "text"  # the pipeline's text input (discovered)

    @property
    def label(self) -> str:
        gen = "pa" if self.generator == "perf_analyzer" else "locust"
        if self.task == classify_bench.TASK:
            if self.system == "fastapi":
                return f"fastapi+torch /predict {self.name}"
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


def classify_pipelines(args: argparse.Namespace) -> list[Pipeline]:
    """Every classification pipeline of ``--model-repository`` (discovered)."""
    found = pipelines(args.model_repository).values()
    return [p for p in found if p.task == classify_bench.TASK]


def bench_pipeline(args: argparse.Namespace) -> Pipeline:
    """The embedding pipeline to measure (``--pipeline-name``, else the default), discovered from
    ``--model-repository`` (the served one, or a copy of a running server's)."""
    return choose(pipelines(args.model_repository), tasks.default().name, args.pipeline_name)
