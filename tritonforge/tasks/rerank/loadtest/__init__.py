"""The rerank task's load tests: its Locust users (:mod:`.locustfile`, by protocol) and its bench
cell (:func:`bench_cell`: documents/s served versus the in-process ONNX Runtime limit)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
USERS = {
    "http": ["RerankHttpUser"],
    "grpc": ["RerankGrpcUser"],
    "both": ["RerankHttpUser", "RerankGrpcUser"],
}
# One query's candidates, as a retriever hands them over (lengths vary like real passages).
QUERY = "how does an inference server batch requests from many clients?"
DOCUMENTS = tuple(
    f"Passage {i}: "
    + " ".join(
        (
            "requests wait in a queue until the scheduler forms a batch",
            "the weather stays dry with a light breeze from the west",
            "a batch is padded to its longest sequence before the model runs",
        )[i % 3]
        for _ in range(1 + i % 4)
    )
    for i in range(32)
)


def _median_s(call: Callable[[], Any], runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench_cell(
    client: Any, reference: Any, runs: int = 5, route: str = "ensemble"
) -> dict[str, Any]:
    """Documents/s of one query's :data:`DOCUMENTS` served (``client.rerank`` on ``route``) and
    in process (``reference``: an ``OrtReranker``, the limit), median of ``runs`` interleaved;
    a ratio, measured in one run (the machine's load is the caller's to report)."""
    documents = list(DOCUMENTS)
    served, local = [], []
    for _ in range(runs):
        served.append(_median_s(lambda: client.rerank(QUERY, documents, route=route), 1))
        local.append(_median_s(lambda: reference.rerank(QUERY, documents), 1))
    served_s, local_s = statistics.median(served), statistics.median(local)
    return {
        "cell": f"rerank {route}",
        "documents": len(documents),
        "served_documents_per_s": round(len(documents) / served_s, 2),
        "in_process_documents_per_s": round(len(documents) / local_s, 2),
        "served_over_in_process": round(local_s / served_s, 3),
    }


def bench_section(client: Any, repository: Path, runs: int = 5) -> list[dict[str, Any]]:
    """``make bench``'s rerank section (``loadtest.bench.sections``): the default reranker's
    ensemble and BLS, served vs in-process (:func:`bench_cell`); ``[]`` when it is not exported."""
    from tritonforge.tasks.rerank.export import OrtReranker, package_dir
    from tritonforge.tasks.rerank.spec import MS_MARCO_MINILM

    spec = MS_MARCO_MINILM
    if not (repository / spec.ensemble / "config.pbtxt").is_file():
        return []
    reference = OrtReranker(package_dir(spec), spec)
    return [bench_cell(client, reference, runs=runs, route=r) for r in ("ensemble", "bls")]
