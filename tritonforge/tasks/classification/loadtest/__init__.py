"""The classification task's load tests: its Locust users (:mod:`.locustfile`, by protocol;
``loadtest.locust.run --task classification`` reads them here) and its ``make bench`` cell
(:data:`BENCH`: the module :mod:`.bench`, which ``loadtest.bench`` reaches through the registry)."""

from pathlib import Path

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
USERS = {
    "http": ["TritonClassifyHttpUser"],
    "grpc": ["TritonClassifyGrpcUser"],
    "both": ["TritonClassifyHttpUser", "TritonClassifyGrpcUser"],
}
FASTAPI_USER = "FastApiPredictUser"  # the FastAPI /predict baseline (make bench)
BENCH = "bench"  # the bench cell beside the default task's: loadtest.bench.cells.task_bench
