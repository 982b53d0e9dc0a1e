"""The classification task's Locust users (the locustfile ``loadtest/locust/classify.py``), by
protocol: ``loadtest.locust.run --task classification`` reads them here."""

from tritonforge.loadtest.locust import CLASSIFY_LOCUSTFILE

LOCUSTFILE = CLASSIFY_LOCUSTFILE
USERS = {
    "http": ["TritonClassifyHttpUser"],
    "grpc": ["TritonClassifyGrpcUser"],
    "both": ["TritonClassifyHttpUser", "TritonClassifyGrpcUser"],
}
