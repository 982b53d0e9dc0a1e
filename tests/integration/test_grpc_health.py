"""The standard gRPC health service (``grpc.health.v1.Health/Check``) that Triton serves, which the
Kubernetes startup probe uses (``grpc: {port: 8001}``), against the real embedded server.

The messages are encoded by hand (``HealthCheckRequest{string service = 1}``,
``HealthCheckResponse{ServingStatus status = 1}``): ``grpcio-health-checking`` would pull
protobuf 7 while the lock has protobuf 6.
"""

from __future__ import annotations

import urllib.request

import grpc
import pytest

from tritonforge.runtime.launcher.settings import free_port
from tritonforge.runtime.serving import EmbeddedServer

pytestmark = pytest.mark.integration
CHECK = "/grpc.health.v1.Health/Check"
SERVING = 1  # grpc.health.v1.HealthCheckResponse.ServingStatus


def health_check(address: str, service: str = "", timeout_s: float = 5.0) -> int:
    """The ServingStatus Triton answers for ``service`` ("" = the whole server)."""
    encoded = service.encode()
    request = (b"\x0a" + bytes([len(encoded)]) + encoded) if encoded else b""
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(CHECK, request_serializer=bytes, response_deserializer=bytes)
        response: bytes = call(request, timeout=timeout_s)
    if not response:
        return 0  # proto3 default: UNKNOWN
    assert response[0] == 0x08, response  # field 1, varint
    return response[1]


@pytest.mark.parametrize("service", ["", "inference.GRPCInferenceService"])
def test_a_ready_server_answers_serving(pipeline_server: EmbeddedServer, service: str) -> None:
    with urllib.request.urlopen(f"http://{pipeline_server.http_url}/v2/health/ready") as resp:
        assert resp.status == 200
    assert health_check(pipeline_server.grpc_url, service) == SERVING


def test_health_check_is_not_restricted(pipeline_server: EmbeddedServer) -> None:
    # The admin key gates model-repository/config/statistics...; a probe carries no key.
    assert pipeline_server.settings.restrict_apis
    assert health_check(pipeline_server.grpc_url) == SERVING


def test_no_server_is_unavailable() -> None:
    with pytest.raises(grpc.RpcError) as info:
        health_check(f"127.0.0.1:{free_port()}", timeout_s=2)
    assert info.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
