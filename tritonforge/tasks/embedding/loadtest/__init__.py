"""The embedding task's load tests: its Locust users (:mod:`.locustfile`, by protocol), which
``loadtest.locust.run --task embedding`` and ``make bench`` read here."""

from pathlib import Path

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
USERS = {
    "http": ["TritonHttpUser"],
    "grpc": ["TritonGrpcUser"],
    "both": ["TritonHttpUser", "TritonGrpcUser"],
}
OPENAI_USER = "OpenAIEmbeddingsUser"  # /v1/embeddings (make bench's "openai" protocol)
FASTAPI_USER = "FastApiUser"  # the FastAPI baseline (make bench)
