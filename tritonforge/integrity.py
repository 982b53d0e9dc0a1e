"""sha256 sidecars: every exported artifact ``X`` has ``X.sha256``; loaders verify it."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tritonforge.errors import ArtifactIntegrityError

CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sidecar_of(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def write_sidecar(path: Path) -> Path:
    """Write ``path.sha256`` in ``sha256sum`` format; returns the sidecar's path."""
    side = sidecar_of(path)
    side.write_text(f"{sha256_file(path)}  {path.name}\n")
    return side


def verify_sidecar(path: Path, required: bool = False) -> str | None:
    """Check ``path`` against its sidecar; raise :class:`ArtifactIntegrityError` naming the file.

    Returns the digest, or None when there is no sidecar and ``required`` is false.
    """
    side = sidecar_of(path)
    if not side.exists():
        if required:
            raise ArtifactIntegrityError(
                f"{path.name}: missing checksum sidecar {side.name}; re-run `make export`"
            )
        return None
    want = side.read_text().split()[0].strip().lower() if side.read_text().strip() else ""
    got = sha256_file(path)
    if got != want:
        raise ArtifactIntegrityError(
            f"{path}: sha256 {got[:16]}… does not match {side.name} ({want[:16]}…); the artifact "
            "is corrupt or was modified after export; re-run `make export`"
        )
    return got
