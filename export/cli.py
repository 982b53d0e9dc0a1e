"""``python -m tritonforge.export <spec> [--format onnx|torchscript|all] [--quantize int8] [--version N]``
and ``python -m tritonforge.export clean``."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from tritonforge.export.decoder.config import clean_decoders
from tritonforge.export.errors import ExportError
from tritonforge.export.pipeline import FORMATS, Options, run_export
from tritonforge.export.repository import clean
from tritonforge.export.specs import DECODERS, REGISTRY, get_spec

DEFAULT_REPOSITORY = Path(os.environ.get("TRITONFORGE_MODEL_REPOSITORY", "model_repository"))
log = logging.getLogger(__name__)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tritonforge.export", description=__doc__)
    p.add_argument(
        "spec",
        help=f"a registered spec ({', '.join(sorted([*REGISTRY, *DECODERS]))}) or 'clean'",
    )
    p.add_argument("--format", choices=[*FORMATS, "all"], default="all")
    p.add_argument("--quantize", choices=["int8"], default=None)
    p.add_argument("--version", type=int, default=1)
    p.add_argument("--model-repository", type=Path, default=DEFAULT_REPOSITORY)
    p.add_argument("--force", action="store_true", help="export even if the inputs are unchanged")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.spec == "clean":
            removed = clean(args.model_repository, [get_spec(n) for n in REGISTRY])
            removed += clean_decoders(args.model_repository, [f() for f in DECODERS.values()])
            log.info(
                "==> [export clean] removed %d item(s): %s", len(removed), ", ".join(removed) or "-"
            )
            return 0
        if args.spec in DECODERS:
            from tritonforge.export.decoder.pipeline import run_decoder_export

            spec = DECODERS[args.spec]()
            run_decoder_export(spec, args.model_repository, args.quantize == "int8", args.force)
            return 0
        if args.version < 1:
            raise ExportError("--version must be >= 1")
        formats = FORMATS if args.format == "all" else (args.format,)
        options = Options(
            repo=args.model_repository,
            formats=formats,
            quantize=args.quantize,
            version=args.version,
            force=args.force,
        )
        run_export(get_spec(args.spec), options)
    except ExportError as e:
        log.error("export failed: %s", e)
        return 1
    return 0
