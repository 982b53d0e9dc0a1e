"""The verification cache of :mod:`tritonforge.integrity`: a file version is hashed once, a file
changed in place (even with its size and mtime put back) is hashed again and refused."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from tritonforge import integrity
from tritonforge.errors import ArtifactIntegrityError
from tritonforge.integrity import VerifiedDigests, verify_sidecar, write_sidecar


@pytest.fixture
def artifact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A verified-looking artifact with its sidecar, old enough to be remembered."""
    monkeypatch.setattr(integrity, "RACY_S", 0.05)
    path = tmp_path / "repo" / "model.onnx"
    path.parent.mkdir()
    path.write_bytes(b"weights " * 1000)
    write_sidecar(path)
    time.sleep(0.1)  # past RACY_S: this version may be remembered
    return path


def _count_hashes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = integrity.hashlib.sha256

    def counting(*args: bytes) -> object:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(integrity.hashlib, "sha256", counting)
    return calls


def test_a_verified_version_is_not_hashed_again(
    artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    hashes = _count_hashes(monkeypatch)
    first = verify_sidecar(artifact, required=True, cache_dir=cache)
    second = verify_sidecar(artifact, required=True, cache_dir=cache)
    assert first == second
    assert len(hashes) == 1
    assert stat.S_IMODE((cache / "verified").stat().st_mode) == 0o700
    # nothing written into the repository
    assert set(artifact.parent.iterdir()) == {artifact, integrity.sidecar_of(artifact)}


def test_a_file_corrupted_in_place_with_its_mtime_restored_is_caught(
    artifact: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    verify_sidecar(artifact, required=True, cache_dir=cache)
    assert len(list((cache / "verified").iterdir())) == 1  # remembered
    before = artifact.stat()
    data = bytearray(artifact.read_bytes())
    data[10] ^= 0xFF
    with open(artifact, "r+b") as f:  # in place: same inode, same size
        f.write(data)
    os.utime(artifact, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = artifact.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino,
        before.st_size,
        before.st_mtime_ns,
    )
    with pytest.raises(ArtifactIntegrityError, match="does not match"):
        verify_sidecar(artifact, required=True, cache_dir=cache)


def test_a_changed_sidecar_is_read_every_time(artifact: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    verify_sidecar(artifact, required=True, cache_dir=cache)
    integrity.sidecar_of(artifact).write_text("0" * 64 + "  model.onnx\n")
    with pytest.raises(ArtifactIntegrityError):
        verify_sidecar(artifact, required=True, cache_dir=cache)


def test_a_recently_changed_file_is_not_remembered(tmp_path: Path) -> None:
    path = tmp_path / "fresh.bin"
    path.write_bytes(b"x" * 100)
    write_sidecar(path)
    cache = tmp_path / "cache"
    verify_sidecar(path, required=True, cache_dir=cache)
    assert not any((cache / "verified").iterdir())  # ctime within RACY_S: not remembered


def test_an_untrusted_cache_directory_is_not_used(
    artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "shared"
    cache = root / "verified"
    cache.mkdir(parents=True)
    cache.chmod(0o777)
    hashes = _count_hashes(monkeypatch)
    verify_sidecar(artifact, required=True, cache_dir=root)
    verify_sidecar(artifact, required=True, cache_dir=root)
    assert len(hashes) == 2
    assert not any(cache.iterdir())
    # a forged entry in a directory others may write is never believed
    (cache / VerifiedDigests.key(artifact.stat())).write_text(
        integrity.sidecar_of(artifact).read_text().split()[0]
    )
    assert VerifiedDigests(cache).get(artifact.stat()) is None


def test_settings_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(integrity.CACHE_DIR_ENV, "off")
    assert integrity.default_cache_dir() is None
    monkeypatch.setenv(integrity.CACHE_DIR_ENV, str(tmp_path / "c"))
    assert integrity.default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv(integrity.CACHE_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert integrity.default_cache_dir() == tmp_path / "xdg" / "tritonforge"


def test_old_entries_are_pruned(
    artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(integrity, "MAX_ENTRIES", 3)
    root = tmp_path / "cache"
    cache = root / "verified"
    cache.mkdir(mode=0o700, parents=True)
    for i in range(5):
        old = cache / f"0-{i}-0-0-0"
        old.write_text("a" * 64)
        os.utime(old, (1, 1))
    verify_sidecar(artifact, required=True, cache_dir=root)
    assert len(list(cache.iterdir())) == 3
    assert VerifiedDigests(cache).get(artifact.stat()) is not None
