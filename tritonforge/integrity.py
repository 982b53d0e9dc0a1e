"""sha256 sidecars: every exported artifact ``X`` has ``X.sha256``; loaders verify it.

Contract of :func:`verify_sidecar`: the bytes a loader is about to read hash to the digest in the
sidecar, or :class:`ArtifactIntegrityError` names the file. Hashing the 650 MB decoder took 1.3 s
of every (re)load, so the digest of a file is remembered once per *file version*
(:class:`VerifiedDigests`): keyed by ``(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)``, in
a per-user directory outside the model repository (the repository may be read-only, e.g.
``/models`` in the container). Any write to a file, ``truncate``, ``chmod`` or ``os.utime``
(which can put an old mtime back) moves its ``ctime`` to now, and an unprivileged process cannot
set ``ctime``, so a file changed in place is hashed again; the export replaces files atomically
(a new inode), so a re-export is a new key too. A version changed less than ``RACY_S`` ago is
not remembered (ctime comes from a coarse clock). The sidecar itself is read on every call: the
cache holds what the artifact hashes to, never the verdict.

Settings: ``$TRITONFORGE_CACHE_DIR`` (default ``$XDG_CACHE_HOME/tritonforge``, ``~/.cache/...``,
or ``<tmp>/tritonforge-<uid>`` when home is not writable; digests in its ``verified/``);
``off`` turns the cache off (every load hashes). The directory is created ``0700``; one that
another user owns, or that group or others may write, is not used (every load then hashes).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
import time
from pathlib import Path

from tritonforge.errors import ArtifactIntegrityError

CHUNK = 1 << 20
CACHE_DIR_ENV = "TRITONFORGE_CACHE_DIR"
CACHE_OFF = "off"
MAX_ENTRIES = 4096  # ~64 bytes each; the oldest go first past this
# The kernel stamps ctime from a coarse clock (a few ms): two writes within one tick can leave
# the same ctime. A version changed less than this long ago is hashed, never remembered (git's
# "racy" entries, the same problem).
RACY_S = 1.0


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


def default_cache_dir() -> Path | None:
    """The per-user cache root (digests in its ``verified/``, optimised ONNX graphs in its
    ``ort/``): ``$TRITONFORGE_CACHE_DIR`` (``off``: none), else the user's cache directory, else
    a per-user directory in the temp dir."""
    configured = os.environ.get(CACHE_DIR_ENV, "").strip()
    if configured.lower() == CACHE_OFF:
        return None
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg) if xdg else Path.home() / ".cache"
    with contextlib.suppress(OSError, RuntimeError):
        base.mkdir(parents=True, exist_ok=True)
        if os.access(base, os.W_OK | os.X_OK):
            return base / "tritonforge"
    return Path(tempfile.gettempdir()) / f"tritonforge-{os.getuid()}"


def private_dir(directory: Path) -> bool:
    """Create ``directory`` (0700, parents too) if needed; True only when it is a directory of
    ours (not a symlink) that nobody else may write."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = directory.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


class VerifiedDigests:
    """File version -> sha256 of its bytes, one small file per version in ``directory`` (see the
    module docstring). Never raises: a directory it cannot use or trust only means hashing."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @staticmethod
    def key(st: os.stat_result) -> str:
        return f"{st.st_dev}-{st.st_ino}-{st.st_size}-{st.st_mtime_ns}-{st.st_ctime_ns}"

    def _usable(self) -> bool:
        return private_dir(self.directory)

    def get(self, st: os.stat_result) -> str | None:
        if not self._usable():
            return None
        try:
            digest = (self.directory / self.key(st)).read_text().strip()
        except OSError:
            return None
        return (
            digest if len(digest) == 64 and all(c in "0123456789abcdef" for c in digest) else None
        )

    def put(self, st: os.stat_result, digest: str) -> None:
        if not self._usable():
            return
        with contextlib.suppress(OSError):
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-")
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(digest + "\n")
                os.replace(tmp, self.directory / self.key(st))
            except OSError:
                Path(tmp).unlink(missing_ok=True)
                raise
            self._prune()

    def _prune(self) -> None:
        entries = [p for p in self.directory.iterdir() if not p.name.startswith(".")]
        if len(entries) <= MAX_ENTRIES:
            return
        entries.sort(key=lambda p: p.stat().st_mtime_ns)
        for old in entries[: len(entries) - MAX_ENTRIES]:
            old.unlink(missing_ok=True)


def _hash_version(path: Path, cache: VerifiedDigests | None) -> str:
    """sha256 of ``path``'s bytes: remembered for this file version, or read and hashed (and
    remembered when the file did not change while it was read)."""
    with open(path, "rb") as f:
        before = os.fstat(f.fileno())
        if cache is not None and (known := cache.get(before)) is not None:
            return known
        h = hashlib.sha256()
        while chunk := f.read(CHUNK):
            h.update(chunk)
        digest = h.hexdigest()
        settled = time.time_ns() - before.st_ctime_ns >= RACY_S * 1e9
        if cache is not None and settled and cache.key(os.fstat(f.fileno())) == cache.key(before):
            cache.put(before, digest)
    return digest


def verify_sidecar(
    path: Path, required: bool = False, cache_dir: Path | None = None, cache: bool = True
) -> str | None:
    """Check ``path`` against its sidecar; raise :class:`ArtifactIntegrityError` naming the file.

    Returns the digest, or None when there is no sidecar and ``required`` is false.
    ``cache_dir``: the cache root whose ``verified/`` remembers digests of file versions (None:
    :func:`default_cache_dir`); ``cache=False`` hashes the file whatever is remembered.
    """
    side = sidecar_of(path)
    if not side.exists():
        if required:
            raise ArtifactIntegrityError(
                f"{path.name}: missing checksum sidecar {side.name}; re-run `make export`"
            )
        return None
    text = side.read_text()
    want = text.split()[0].strip().lower() if text.strip() else ""
    root = (cache_dir or default_cache_dir()) if cache else None
    got = _hash_version(path, VerifiedDigests(root / "verified") if root is not None else None)
    if got != want:
        raise ArtifactIntegrityError(
            f"{path}: sha256 {got[:16]}… does not match {side.name} ({want[:16]}…); the artifact "
            "is corrupt or was modified after export; re-run `make export`"
        )
    return got
