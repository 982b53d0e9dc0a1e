"""The project's optional extras (``[project.optional-dependencies]`` of pyproject.toml) that a
bench anchor needs, installed on demand: a fresh ``make setup`` venv has ``dev`` only, and an
anchor's build step (``make llamacpp``) must work alone.

The extra's requirements are read from the installed project's metadata (``Requires-Dist``
lines with ``extra == "..."``), the one place they are declared; only those missing, or
installed at a version outside their pin, are pip-installed, under the lock (constraints.txt).
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from tritonforge.loadtest.errors import LoadtestError
from tritonforge.model_packages import installed_version

log = logging.getLogger("tritonforge.loadtest.anchors.extras")

DISTRIBUTION = "tritonforge"


class ExtraError(LoadtestError):
    """An extra's requirements could not be read or installed."""


def extra_requirements(requires: Sequence[str], extra: str) -> list[Requirement]:
    """The requirements among ``requires`` (``Requires-Dist`` lines) that only ``extra`` brings
    in (a line without a marker, or one true without the extra, is a main dependency)."""
    try:
        reqs = [Requirement(r) for r in requires]
    except InvalidRequirement as e:
        raise ExtraError(f"{DISTRIBUTION}'s metadata has a bad requirement: {e}") from e
    return [
        r
        for r in reqs
        if r.marker is not None
        and r.marker.evaluate({"extra": extra})
        and not r.marker.evaluate({"extra": ""})
    ]


def missing(
    reqs: Sequence[Requirement],
    installed: Callable[[str], str | None] = installed_version,
) -> list[Requirement]:
    """The requirements not installed, or installed at a version their specifier refuses."""
    out = []
    for r in reqs:
        version = installed(r.name)
        if version is None or not r.specifier.contains(version, prereleases=True):
            out.append(r)
    return out


def pip_install_command(reqs: Sequence[Requirement], constraints: Path | None) -> list[str]:
    """``pip install`` of ``reqs`` into this interpreter's venv, under ``constraints`` if given."""
    cmd = [sys.executable, "-m", "pip", "install"]
    if constraints is not None:
        cmd += ["-c", str(constraints)]
    # name, extras and specifier only: the marker (extra == "bench") would make pip skip it
    return cmd + [
        f"{r.name}{'[' + ','.join(sorted(r.extras)) + ']' if r.extras else ''}{r.specifier}"
        for r in reqs
    ]


def ensure_extra(extra: str, constraints: Path | None = None) -> list[Requirement]:
    """pip-install the project's ``extra`` requirements this venv lacks; returns those installed
    (none when every one is there at its pinned version)."""
    try:
        requires = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError as e:
        raise ExtraError(f"{DISTRIBUTION} is not installed in this venv: run `make setup`") from e
    todo = missing(extra_requirements(requires, extra))
    if not todo:
        return []
    if constraints is not None and not constraints.is_file():
        constraints = None
    cmd = pip_install_command(todo, constraints)
    log.info("    installing the %r extra: $ %s", extra, " ".join(cmd))
    try:
        subprocess.run(cmd, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise ExtraError(
            f"pip install of the {extra!r} extra failed ({e}); install it by hand: "
            f"pip install -c constraints.txt -e '.[{extra}]'"
        ) from e
    return todo
