"""Wire names shared by the server side (front, launcher, deploy checks) and the client.

They live in the core so that the client never imports the server to learn a header's name.
"""

from __future__ import annotations

ADMIN_HEADER = "x-tritonforge-admin"
"""Unlocks Triton's restricted APIs (model config, repository, statistics) with the admin key."""
GRPC_ADMIN_HEADER = f"triton-grpc-protocol-{ADMIN_HEADER}"
"""The same key as gRPC metadata: Triton expects its ``triton-grpc-protocol-`` prefix there."""
