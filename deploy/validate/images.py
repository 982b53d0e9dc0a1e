"""The container images: the NGC release the Dockerfile builds FROM, and its Python pins against
the lock (``constraints.txt``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from tritonforge.deploy.validate.documents import DeployCheckError
from tritonforge.deploy.validate.paths import CONSTRAINTS, DOCKERFILE

# NGC container release -> Triton server version (NGC "Triton Inference Server Release Notes").
NGC_TRITON_RELEASES: dict[str, str] = {
    "24.06": "2.47.0",
    "24.07": "2.48.0",
    "24.08": "2.49.0",
    "24.09": "2.50.0",
    "24.10": "2.51.0",
    "24.11": "2.52.0",
    "24.12": "2.53.0",
    "25.01": "2.54.0",
}
# Pins of the Triton image that cannot equal the lock file, which is resolved on the venv's Python
# 3.11: name -> the container's (3.10) version. multidict 7.2 requires Python >= 3.11.
# onnxruntime 1.23.2: the last release with a cp310 wheel (the fused first step's stub runs the
# encoder graph itself; the lock's 1.32 needs Python 3.11)
CONTAINER_PINS: dict[str, str] = {"multidict": "7.1.0", "onnxruntime": "1.23.2"}


def ngc_tag(dockerfile: Path = DOCKERFILE) -> str:
    """The NGC release (``24.10``) of the ``tritonserver`` image the Dockerfile builds FROM."""
    for line in dockerfile.read_text().splitlines():
        m = re.match(r"\s*FROM\s+nvcr\.io/nvidia/tritonserver:(\d{2}\.\d{2})-py3\b", line, re.I)
        if m:
            return m.group(1)
    raise DeployCheckError(
        f"{dockerfile} does not build FROM nvcr.io/nvidia/tritonserver:YY.MM-py3"
    )


def triton_version_for_ngc_tag(tag: str) -> str:
    try:
        return NGC_TRITON_RELEASES[tag]
    except KeyError as e:
        raise DeployCheckError(
            f"unknown NGC release {tag}; add it to NGC_TRITON_RELEASES from NVIDIA's release notes"
        ) from e


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    """``name==version`` lines of a requirements/constraints file (extras dropped, names normalised)."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*==\s*([^\s;]+)", line)
        if m:
            out[_normalise(m.group(1))] = m.group(3)
        elif line and not line.startswith("-"):
            out[_normalise(re.split(r"[\[<>=!~ ;]", line, maxsplit=1)[0])] = ""
    return out


def pin_findings(
    requirements: Path, constraints: Path = CONSTRAINTS, own: Mapping[str, str] | None = None
) -> list[str]:
    """Every package of ``requirements`` pinned exactly, to the same version as ``constraints``
    (or, for a name in ``own``, to that version)."""
    lock = {**pins(constraints), **(own or {})}
    out: list[str] = []
    for name, version in pins(requirements).items():
        if not version:
            out.append(f"{requirements.name}: {name} is not pinned with ==")
        elif name not in lock:
            out.append(f"{requirements.name}: {name} is not in {constraints.name}")
        elif lock[name].split("+")[0] != version:
            out.append(
                f"{requirements.name}: {name}=={version} but {constraints.name} has {lock[name]}"
            )
    return out


def dockerfile_installs(dockerfile: Path, requirements: Path) -> bool:
    """Whether the Dockerfile copies and ``pip install -r``s ``requirements``."""
    text = dockerfile.read_text()
    return (
        requirements.name in text
        and re.search(r"pip install[^\n]*(\\\n[^\n]*)*-r\s", text) is not None
    )


PACKAGE_DIR = "tritonforge"
DANGLING_LINKS_STEP = "-xtype l -delete"


def image_link_findings(dockerfile: Path = DOCKERFILE, root: Path | None = None) -> list[str]:
    """The image's ``tritonforge/`` package must have no dangling links: each link of the
    checkout's ``tritonforge/X -> ../X`` is either backed by a ``COPY X /opt/tritonforge/X`` or
    removed by a ``find ... -xtype l -delete`` step (a dangling ``tritonforge.client`` would fail
    at import time, far from the cause)."""
    from tritonforge.deploy.validate.paths import PROJECT_ROOT

    package = (root or PROJECT_ROOT) / PACKAGE_DIR
    text = dockerfile.read_text()
    copied = set(re.findall(r"^COPY\s+(\S+)\s+/opt/tritonforge/\1\s*$", text, re.M))
    if DANGLING_LINKS_STEP in text:
        return []
    return [
        f"{dockerfile.name}: tritonforge/{link.name} links to {link.name}/, which the image does "
        f"not COPY; copy it or delete the dangling links (find ... {DANGLING_LINKS_STEP})"
        for link in sorted(package.iterdir())
        if link.is_symlink() and link.name not in copied
    ]
