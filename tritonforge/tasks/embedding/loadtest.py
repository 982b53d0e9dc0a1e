"""The embedding task's Locust users (the locustfile ``loadtest/locust/embed.py``), by protocol:
``loadtest.locust.run --task embedding`` reads them here."""

from tritonforge.loadtest.locust import EMBED_LOCUSTFILE

LOCUSTFILE = EMBED_LOCUSTFILE
USERS = {
    "http": ["TritonHttpUser"],
    "grpc": ["TritonGrpcUser"],
    "both": ["TritonHttpUser", "TritonGrpcUser"],
}
